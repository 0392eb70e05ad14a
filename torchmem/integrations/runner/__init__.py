"""Running a program under torchmem (``torchmem run``): what to run and how
(:mod:`.target`), and what is reported when it ends (:mod:`.session`)."""
