"""The one distinction every caller needs: errors in what the user gave, and bugs.

A `UserError` describes the input (a file, a line, a config option, a missing stage
output) and says what to do; the command line prints it as one line and exits 2, and
the failed Prefect and MLflow runs carry the same message. Anything else is a bug and
keeps its traceback.
"""


class UserError(Exception):
    pass


class MissingInputError(UserError, FileNotFoundError):
    """A file the user names, or an earlier stage writes, is not there: the message says which
    and what to do. Any other FileNotFoundError is a bug (a path mule itself got wrong)."""


class InputError(UserError, ValueError):
    """The data given cannot be used as it is (no captions in a split, no word vectors)."""


def is_user_error(error: BaseException) -> bool:
    """Only errors raised by mule's own input checks: everything else, a FileNotFoundError
    or a ValueError from deep inside included, is a bug and keeps its traceback."""
    return isinstance(error, UserError)
