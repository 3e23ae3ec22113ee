"""The one distinction every caller needs: errors in what the user gave, and bugs.

A `UserError` describes the input (a file, a line, a config option, a missing stage
output) and says what to do; the command line prints it as one line and exits 2, and
the failed Prefect and MLflow runs carry the same message. Anything else is a bug and
keeps its traceback.
"""


class UserError(Exception):
    pass


def is_user_error(error: BaseException) -> bool:
    # FileNotFoundError names the path the user gave (a --source, a weights file).
    return isinstance(error, UserError | FileNotFoundError)
