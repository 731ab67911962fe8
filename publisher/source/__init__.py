"""`rsnotify source`: a folder served as a ResourceSync Source, its changes published."""
