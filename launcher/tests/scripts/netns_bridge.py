"""Nodes on one switch, as pods are: network namespaces PREFIX0..PREFIX<N-1>, each
with its end named eth0 (SUBNET.<10+i>/24), joined by a bridge PREFIXbr (SUBNET.1);
one node's link shaped both ways with a token bucket (a bad cable, a degraded port).
pyroute2, pure Python (the GPU machine has no iproute2).
Usage: python3 netns_bridge.py up PREFIX SUBNET N | shape PREFIX I MBIT | down PREFIX N"""
import sys
from pyroute2 import IPRoute, NetNS, netns


def host_if(prefix, i):
    return f"v{prefix}{i}"[:15]


def up(prefix, subnet, n):
    down(prefix, n)
    br = f"{prefix}br"[:15]
    with IPRoute() as ipr:
        ipr.link("add", ifname=br, kind="bridge")
        b = ipr.link_lookup(ifname=br)[0]
        ipr.addr("add", index=b, address=f"{subnet}.1", mask=24)
        ipr.link("set", index=b, state="up")
        for i in range(n):
            name = f"{prefix}{i}"
            netns.create(name)
            ipr.link("add", ifname=host_if(prefix, i), kind="veth",
                     peer={"ifname": "eth0", "net_ns_fd": name})
            v = ipr.link_lookup(ifname=host_if(prefix, i))[0]
            ipr.link("set", index=v, master=b, state="up")
            ns = NetNS(name)
            for ifname in ("eth0", "lo"):
                j = ns.link_lookup(ifname=ifname)[0]
                if ifname == "eth0":
                    ns.addr("add", index=j, address=f"{subnet}.{10 + i}", mask=24)
                ns.link("set", index=j, state="up")
            ns.close()
    print(f"bridge {br} {subnet}.1: {n} namespaces {prefix}0.. at {subnet}.10..")


def shape(prefix, i, mbit):
    """A token bucket of MBIT on both ends of node i's link: what it sends and what
    it is sent."""
    rate = f"{mbit}mbit"
    spec = dict(rate=rate, burst=64 * 1024, latency="50ms")
    with IPRoute() as ipr:
        v = ipr.link_lookup(ifname=host_if(prefix, i))[0]
        ipr.tc("add", "tbf", v, 0x10000, **spec)
    ns = NetNS(f"{prefix}{i}")
    j = ns.link_lookup(ifname="eth0")[0]
    ns.tc("add", "tbf", j, 0x10000, **spec)
    ns.close()


def down(prefix, n):
    with IPRoute() as ipr:
        for name in [f"{prefix}br"[:15]] + [host_if(prefix, i) for i in range(n)]:
            for k in ipr.link_lookup(ifname=name):
                ipr.link("del", index=k)
    for i in range(n):
        if f"{prefix}{i}" in netns.listnetns():
            netns.remove(f"{prefix}{i}")


op, prefix = sys.argv[1], sys.argv[2]
if op == "up":
    up(prefix, sys.argv[3], int(sys.argv[4]))
elif op == "shape":
    shape(prefix, int(sys.argv[3]), int(sys.argv[4]))
else:
    down(prefix, int(sys.argv[3]))
