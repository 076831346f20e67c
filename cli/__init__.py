"""The ``mqlake`` command: one root composing the broker's servers, ``admin``, the store tools and the
pipeline jobs.  It sits on top of every other package; nothing imports it."""
