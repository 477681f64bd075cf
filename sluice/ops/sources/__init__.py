"""Sources: folders and object-store prefixes a dataset follows, synced by listing and comparing.

``listing`` reads a source, ``plan`` decides what a sync does, ``previewing`` shows that plan,
``syncing`` carries it out, ``manage`` are the front ends' calls, ``follow`` the workers' rounds.
"""
