"""Facts about a file (and the program it belongs to) computed once, read by every rule: what
a value is decided by where it comes from and where it goes, never by how it is spelled."""
