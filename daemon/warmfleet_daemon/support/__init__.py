"""Small process-level helpers with no daemon knowledge: a background thread, OpenBLAS
ahead of mlx, bounded reads of regular files."""
