"""Metrics: overlap scores on binarised masks (:mod:`.segmentation`), caption metrics equal to
pycocoevalcap (:mod:`.caption`) and the statistics used to compare conditions (:mod:`.stats`).
Import from the submodules: this package imports none of them, so a mask metric never pulls in scipy."""
