#!/bin/sh
# Runs "$@" with a private /dev holding only GPU $POD_GPU's device nodes (what the
# device plugin gives a pod) and /dev/shm either the host's (POD_SHM=shared: hostIPC
# or a hostPath mount) or a fresh tmpfs (POD_SHM=own: a pod's default). Must run in
# its own mount namespace (unshare --mount --propagation private).
set -e
d=$(mktemp -d /tmp/poddev.XXXXXX)
mount -t tmpfs tmpfs "$d"
for n in null zero full random urandom tty nvidiactl nvidia-uvm nvidia-uvm-tools "nvidia$POD_GPU"; do
  [ -e "/dev/$n" ] || continue
  touch "$d/$n"; mount --bind "/dev/$n" "$d/$n"
done
[ -d /dev/nvidia-caps ] && mkdir "$d/nvidia-caps" && mount --rbind /dev/nvidia-caps "$d/nvidia-caps"
mkdir "$d/shm"
if [ "$POD_SHM" = shared ]; then mount --bind /dev/shm "$d/shm"; else mount -t tmpfs -o size=1g tmpfs "$d/shm"; fi
ln -s /proc/self/fd "$d/fd"; ln -s /proc/self/fd/0 "$d/stdin"; ln -s /proc/self/fd/1 "$d/stdout"; ln -s /proc/self/fd/2 "$d/stderr"
mount --move "$d" /dev
# Read-only, as a pod's device cgroup would: else libcuda's nvidia-modprobe creates
# the other GPUs' nodes and the "pod" runs on GPU 0 whatever it was given.
# POD_DEV_RW=1 leaves it writable (an experiment: does CUDA create the peer's node?).
[ -n "${POD_DEV_RW:-}" ] || mount -o remount,ro /dev
[ -n "${POD_HOSTNAME:-}" ] && hostname "$POD_HOSTNAME"
if [ -n "${POD_DEV_RW:-}" ]; then "$@"; rc=$?; echo "pod /dev after the run: $(ls /dev | tr '\n' ' ')" >&2; exit $rc; fi
exec "$@"
