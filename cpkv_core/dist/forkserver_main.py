"""The program's main script in the fork server, imported there in place of ``__main__``.

Where a caller's preload names ``__main__``, ``start_method`` hands the fork server this
module instead and puts the main script's path in
``start_method.MAIN_PATH_ENV`` (the path ``multiprocessing.spawn.get_preparation_data`` gives
the children), after the id of the process that starts the server. Imported in the server,
this module runs the script there once, as ``__mp_main__``, the way ``spawn.prepare`` runs it
in a child; each fork then finds it loaded under that path and ``spawn.prepare`` returns
without running it again.

NOTE: ``multiprocessing``'s own ``__main__`` preload means to do this, but up to CPython
3.13.7 (and in every 3.11 and 3.12) the server is never given the path:
``ForkServer.ensure_running`` keeps a key ``main_path`` that ``get_preparation_data`` names
``init_main_from_path`` (CPython gh-126631 and gh-137996, fixed in 3.13.8 and 3.14), so every
fork ran the script again: for ``cpkv`` its whole CLI, 0.37 s of CPU a process here.

Nothing else imports this module. Imported anywhere else it loads nothing: the variable
names the server's parent, so a process that inherits it (a rank, a subprocess) leaves its
own main alone.
"""

from __future__ import annotations

import os
from multiprocessing import spawn

from cpkv_core.dist.start_method import MAIN_PATH_ENV


def load_main() -> None:
    """Runs the main script named for this process's parent (``MAIN_PATH_ENV``), if any."""
    pid, _, path = os.environ.get(MAIN_PATH_ENV, "").partition(":")
    if not path or pid != str(os.getppid()):
        return
    try:
        spawn.import_main_path(path)
    except Exception:
        # NOTE: a script that fails here fails in each fork too, which reports it, as it did
        # without the preload; a server that died of it would start no rank at all.
        return


load_main()
