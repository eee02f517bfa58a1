"""What the daemon keeps warm: pushed warm sets (and their state on disk), prefixes a
request asked to keep (`cache_control` pins), and each conversation's next turn."""
