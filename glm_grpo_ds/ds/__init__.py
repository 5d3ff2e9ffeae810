"""The DeepSpeed / ``torch.distributed`` boundary: no module outside this package imports either.

* ``dist.py``: rank, world size, collectives on the process group's communication device, teardown;
* ``ds_config.py``: reading a DeepSpeed JSON and filling its ``"auto"`` values;
* ``engine.py``: process group start, engines, backward / step / lr / gradient norm, rollout gathering;
* ``io.py``: adapter / full-model saving and DeepSpeed checkpoint state.

tests/unit/test_boundaries.py enforces the boundary.
"""
