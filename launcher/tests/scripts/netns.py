"""Creates (up) or removes (down) a network namespace joined to this one by a veth
pair, or cuts the link (cut: this side's end down, as a pulled cable), without
iproute2 (the GPU machine has none): pyroute2, pure Python.
Usage: python3 netns.py up|down|cut NAME [HOST_ADDR NS_ADDR]   (addresses /24)"""
import sys
from pyroute2 import IPRoute, NetNS, netns

op, name = sys.argv[1], sys.argv[2]
host_if = f"v{name}"[:15]
if op == "cut":
    with IPRoute() as ipr:
        for i in ipr.link_lookup(ifname=host_if):
            ipr.link("set", index=i, state="down")
    sys.exit(0)
if op == "down":
    with IPRoute() as ipr:
        for i in ipr.link_lookup(ifname=host_if):
            ipr.link("del", index=i)
    if name in netns.listnetns():
        netns.remove(name)
    sys.exit(0)
here, there = sys.argv[3], sys.argv[4]
netns.create(name)
with IPRoute() as ipr:
    ipr.link("add", ifname=host_if, kind="veth", peer={"ifname": "eth0", "net_ns_fd": name})
    i = ipr.link_lookup(ifname=host_if)[0]
    ipr.addr("add", index=i, address=here, mask=24)
    ipr.link("set", index=i, state="up")
ns = NetNS(name)
for ifname in ("eth0", "lo"):
    i = ns.link_lookup(ifname=ifname)[0]
    if ifname == "eth0":
        ns.addr("add", index=i, address=there, mask=24)
    ns.link("set", index=i, state="up")
ns.close()
print(f"netns {name}: {host_if} {here} <-> eth0 {there}")
