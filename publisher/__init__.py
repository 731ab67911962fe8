"""The Source side: build, split and submit change notifications; advertise the channel."""
