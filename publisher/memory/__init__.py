"""The change memory: every change a Source published, the from/until chain, and the Change
Lists and Resource Lists written from it."""
