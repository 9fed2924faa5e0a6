"""Errors every command shares."""


class UsageError(Exception):
    """The command line asks for something impossible (a missing file, a flag without its
    partner): one line for the user, exit code 2."""
