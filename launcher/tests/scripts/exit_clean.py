"""4 gloo ranks, init through tcp:// or env://, one all_reduce, then exit. With
DESTROY=1 the process group is destroyed first, as PyTorch asks; without it, ranks
can abort at exit under any launcher (pytorch/pytorch#190489: gloo threads outliving
the interpreter)."""
import os, sys, torch, torch.distributed as dist

if sys.argv[1] == "tcp":
    dist.init_process_group("gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
                            rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
else:
    dist.init_process_group("gloo")
t = torch.ones(4)
dist.all_reduce(t)
assert t[0].item() == dist.get_world_size()
if os.environ.get("DESTROY") == "1":
    dist.destroy_process_group()
