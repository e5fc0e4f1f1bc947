"""A worker for the ported torch launcher tests: checks the environment torchrun
promises (the parent's sentinel, the rank variables), joins the gloo group when asked,
and touches <dir>/<RANK>. --fail exits 1."""
import argparse
import os
import sys

p = argparse.ArgumentParser()
p.add_argument("--touch-file-dir")
p.add_argument("--fail", action="store_true")
p.add_argument("--init-method")
p.add_argument("--out-file")
a = p.parse_args()

if a.fail:
    sys.exit(1)
assert os.environ.get("TEST_SENTINEL_PARENT") == "FOOBAR", "parent env not passed"
for k in ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
          "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"]:
    assert k in os.environ, f"{k} missing"
if a.out_file:
    import torch.distributed as dist
    with open(a.out_file, "w") as f:
        f.write(str(dist.is_torchelastic_launched()))
if a.init_method:
    import torch.distributed as dist
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method=a.init_method, rank=rank, world_size=world)
    dist.barrier()
    dist.destroy_process_group()
if a.touch_file_dir:
    open(os.path.join(a.touch_file_dir, os.environ["RANK"]), "w").close()
