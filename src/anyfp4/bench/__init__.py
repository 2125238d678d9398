"""Speed measurement: ``anyfp4 bench`` (``model``, ``tensor_parallel``) and what the scripts in benchmarks/ share
with it — random-weight models (``random_model``), random weights (``random_weights``), timing (``timing``) and
the linear shapes (``shapes``)."""
