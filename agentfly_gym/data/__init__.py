"""Data sets: where they live (:mod:`.paths`), downloading them (:mod:`.download`,
:mod:`.datasets`) and what each environment reads (:mod:`.sources`)."""
