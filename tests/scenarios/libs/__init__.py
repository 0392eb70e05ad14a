"""Small stand-ins for third-party libraries the corpus scenarios use: modules that are not the
script, reached through ``sys.modules``, as a real library is."""
