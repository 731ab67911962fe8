"""The Destination side: callback endpoint, subscription lifecycle, discovery, signatures."""
