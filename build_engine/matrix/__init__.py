"""trtforge.build_engine.matrix: many models x GPU profiles, built locally or on a Ray cluster (``build-matrix``).

``spec`` reads the matrix file, ``cells`` plans cells with their cache keys and cluster resources, ``worker`` builds
one cell, ``executors`` runs cells on local processes or Ray, ``driver`` commits and reports, ``triton_assembly``
writes a Triton repository from the results. See docs/scale-out.md.
"""
