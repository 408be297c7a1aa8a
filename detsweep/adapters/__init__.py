"""Every use of a library's undocumented parts, one module per library.

A name under a library's ``src`` or ``_internal``, or with a leading underscore, a command's
implementation called as a function, a setting read from an undocumented environment
variable: each is reached from here and nowhere else in detsweep, and each has a test of what
detsweep relies on it to *do* (``tests/test_adapters.py``, ``tests/test_schedulers.py``). A
release that changes one fails there, saying which, and ``make upgrade-check`` runs those tests
against the newest releases. Each module is imported only where its library is needed
(``ray.py`` imports Ray only when called), so a command that never needs one never pays for it.
"""
