"""The DeepSpeed / ``torch.distributed`` boundary: no module outside this package imports either.

* ``dist.py``: rank, world size, collectives on the process group's communication device, teardown;
* ``ds_config.py``: reading a DeepSpeed JSON and filling its ``"auto"`` values;
* ``engine.py``: engines, backward / step / lr / gradient norm, and every name the rest of the package calls
  (those of the three modules below included);
* ``process_group.py``: process group start (NCCL, or gloo and DeepSpeed's CPU op);
* ``optimizer.py``: the client optimizer and lr schedule, the config's settings over a checkpoint's;
* ``gathering.py``: ZeRO-3 gathers (the rollout's, a parameter list's) and the plain / training linear;
* ``io.py``: adapter / full-model saving and DeepSpeed checkpoint state.

tests/unit/test_boundaries.py enforces the boundary.
"""
