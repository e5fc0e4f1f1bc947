"""Every TCPStore operation of real PyTorch, as a client of the launcher's store."""
import os, sys
from datetime import timedelta
import torch.distributed as dist
if os.environ["RANK"] != "0":
    sys.exit(0)
s = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timedelta(seconds=10))
s.set("k1", "v1"); assert s.get("k1") == b"v1"
assert s.add("ctr", 5) == 5 and s.add("ctr", -2) == 3
assert s.compare_set("k1", "v1", "v2") == b"v2"
assert s.compare_set("k1", "nope", "v3") == b"v2"
assert s.compare_set("fresh", "", "new") == b"new"
assert s.check(["k1", "ctr"]) and not s.check(["never"])
s.wait(["k1"])
try:
    s.wait(["never"], timedelta(milliseconds=200)); raise SystemExit("wait did not time out")
except RuntimeError as e:
    pass
n = s.num_keys()
assert s.delete_key("fresh") and not s.delete_key("fresh")
assert s.num_keys() == n - 1
s.append("ap", "a"); s.append("ap", "b"); assert s.get("ap") == b"ab"
s.multi_set(["m1", "m2"], ["1", "2"]); assert s.multi_get(["m1", "m2"]) == [b"1", b"2"]
big = os.urandom(300000); s.set("big", big); assert s.get("big") == big
p = dist.PrefixStore("pre", s); p.set("x", b"\x00\xff"); assert p.get("x") == b"\x00\xff"
s.queue_push("q", "first"); s.queue_push("q", "second")
assert s.queue_len("q") == 2
assert s.queue_pop("q") == b"first" and s.queue_len("q") == 1
assert s.queue_pop("q", block=False) == b"second"
print("STORE_OPS_OK", flush=True)
