"""Sources: folders and object-store prefixes a dataset follows, synced by listing and comparing.

``listing`` reads a source, ``plan`` decides what a sync does (one function, for the sync and its
preview), ``previewing`` makes that plan of a source and shows it, ``syncing`` carries it out,
``manage`` are the front ends' calls, ``follow`` the workers' rounds.
"""
