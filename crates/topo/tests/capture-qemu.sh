#!/usr/bin/env bash
# Captures the /sys files softhca-topo reads from a QEMU guest whose PCI layout
# (pxb host bridges on two NUMA nodes, chained pci-bridges) yields every
# distance class, into fixtures/<name>/ as a small tree of text files and
# symlinks. Needs qemu-system-x86, busybox and a Debian kernel in /boot.
#   tests/capture-qemu.sh [OUT_DIR [SOFTHCA_BINARY]]   (default: tests/fixtures/qemu-2numa)
# With the softhca binary, the guest also runs `softhca devinfo -v` with
# SOFTHCA_CPU=auto under several affinity masks and prints each datapath_cpu line
# (a real multi-NUMA placement run).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/fixtures/qemu-2numa}
softhca=${2:-}
kver=$(ls /boot/vmlinuz-* | sed 's#.*/vmlinuz-##' | sort -V | tail -1)
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
root=$work/root
mkdir -p "$root"/{bin,proc,sys,dev,mods,out}
cp /usr/bin/busybox "$root/bin/"
for lib in $(ldd /usr/bin/busybox | grep -o '/[^ ]*'); do
  mkdir -p "$root$(dirname "$lib")"; cp "$lib" "$root$lib"
done
if [ -n "$softhca" ]; then
  mkdir -p "$root/usr/local/bin"; cp "$softhca" "$root/usr/local/bin/softhca"
  for lib in $(ldd "$softhca" | grep -o '/[^ ]*'); do
    mkdir -p "$root$(dirname "$lib")"; cp -n "$lib" "$root$lib"
  done
fi
n=0
for m in virtio_pci virtio_net nvme 8021q dummy; do
  for ko in $(modprobe -S "$kver" --show-depends "$m" | awk '/^insmod/ {print $2}'); do
    grep -qx "$ko" "$work/order" 2>/dev/null && continue
    echo "$ko" >>"$work/order"; cp "$ko" "$root/mods/$(printf %02d $n).ko"; n=$((n + 1))
  done
done
cat >"$root/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sys /sys; echo 0 >/proc/sys/kernel/printk
for ko in /mods/*.ko; do insmod "$ko"; done
sleep 2
ip link set lo up
ip link add dummy0 type dummy 2>/dev/null
for f in /sys/class/net/*; do ip link set "$(basename "$f")" up 2>/dev/null; done
ip link add link eth3 name eth3.10 type vlan id 10 2>/dev/null
copy() { [ -r "$1" ] || return 0; mkdir -p "/out$(dirname "$1")"; cat "$1" >"/out$1" 2>/dev/null || rm -f "/out$1"; }
link() { [ -L "$1" ] || return 0; mkdir -p "/out$(dirname "$1")"; ln -sfn "$(readlink "$1")" "/out$1"; }
for f in /sys/devices/system/node/online /sys/devices/system/node/possible \
         /sys/devices/system/node/node*/cpulist /sys/devices/system/node/node*/cpumap \
         /sys/devices/system/node/node*/distance /sys/devices/system/cpu/online \
         /sys/devices/system/cpu/possible /sys/devices/system/cpu/present \
         /sys/devices/system/cpu/cpu*/topology/*; do copy "$f"; done
for l in /sys/bus/pci/devices/* /sys/class/net/* /sys/class/nvme/*; do
  link "$l"; d=$(readlink -f "$l")
  for f in class vendor device numa_node local_cpulist local_cpus operstate address type ifindex dev_id; do copy "$d/$f"; done
  for s in "$d"/device "$d"/lower_*; do link "$s"; done
done
mkdir -p /out/proc; cat /proc/cpuinfo >/out/proc/cpuinfo
if [ -x /usr/local/bin/softhca ]; then
  # eth3: node 1 (CPUs 2-3); eth2: node 0 (CPUs 0-1). Masks: 0-3, 0-2, 0-1.
  ip addr add 10.40.3.1/24 dev eth3; ip addr add 10.40.2.1/24 dev eth2
  echo '=====PLACEMENT====='
  for run in "f eth3" "7 eth3" "3 eth3" "f eth2"; do
    set -- $run
    line=$(SOFTHCA_CPU=auto SOFTHCA_NETDEV=$2 SOFTHCA_LOG=off taskset "$1" /usr/local/bin/softhca devinfo -v 2>&1 | grep datapath_cpu)
    echo "mask 0x$1 $2: ${line#*datapath_cpu:}"
  done
  echo '=====PLACEMENT-END====='
fi
echo '=====BEGIN====='; tar -C /out -cz . | base64; echo '=====END====='
sleep 2; echo o >/proc/sysrq-trigger; sleep 10
INIT
chmod +x "$root/init"
(cd "$root" && find . | cpio -o -H newc 2>/dev/null | gzip) >"$work/initrd"
accel=${CAPTURE_ACCEL:-tcg}  # KVM hangs on some hosts
# Node 0: CPUs 0-1, node 1: CPUs 2-3. pxb0 (node 0) holds a bridge with two NICs
# and a chain of two more bridges leading to a third, and an NVMe beside it; pxb1 (node 1) a NIC and a
# display controller; pxb2 (node 0) a NIC; the root bus two NICs with no node; a
# VLAN on a pxb0 NIC, a dummy and lo are the virtual interfaces.
timeout 240 qemu-system-x86_64 -machine pc,accel=$accel -m 1024 -smp 4 \
  -object memory-backend-ram,id=m0,size=512M -object memory-backend-ram,id=m1,size=512M \
  -numa node,nodeid=0,cpus=0-1,memdev=m0 -numa node,nodeid=1,cpus=2-3,memdev=m1 \
  -numa dist,src=0,dst=1,val=20 \
  -vga none -nic none -nographic -no-reboot \
  -device virtio-net-pci,romfile=,id=root0,bus=pci.0,addr=0x5 \
  -device virtio-net-pci,romfile=,id=root1,bus=pci.0,addr=0x9 \
  -device pxb,id=pxb0,bus_nr=16,numa_node=0,bus=pci.0,addr=0x6 \
  -device pci-bridge,id=br0,chassis_nr=1,bus=pxb0,addr=0x1 \
  -device virtio-net-pci,romfile=,id=a1,bus=br0,addr=0x1 \
  -device virtio-net-pci,romfile=,id=a2,bus=br0,addr=0x2 \
  -device pci-bridge,id=br1,chassis_nr=2,bus=br0,addr=0x3 \
  -device pci-bridge,id=br2,chassis_nr=3,bus=br1,addr=0x1 \
  -device virtio-net-pci,romfile=,id=a4,bus=br2,addr=0x1 \
  -drive if=none,id=nv,format=raw,file=/dev/null,readonly=on \
  -device nvme,serial=softhca0,drive=nv,bus=pxb0,addr=0x2 \
  -device pxb,id=pxb1,bus_nr=32,numa_node=1,bus=pci.0,addr=0x7 \
  -device virtio-net-pci,romfile=,id=b1,bus=pxb1,addr=0x1 \
  -device bochs-display,bus=pxb1,addr=0x2 \
  -device pxb,id=pxb2,bus_nr=48,numa_node=0,bus=pci.0,addr=0x8 \
  -device virtio-net-pci,romfile=,id=c1,bus=pxb2,addr=0x1 \
  -kernel "/boot/vmlinuz-$kver" -initrd "$work/initrd" \
  -append "console=ttyS0 panic=1 quiet loglevel=0 net.ifnames=0" >"$work/console" 2>&1 || true
cp "$work/console" "${CAPTURE_CONSOLE:-/dev/null}" 2>/dev/null || true
sed -n '/=====BEGIN=====/,/=====END=====/p' "$work/console" | sed '1d;$d' | tr -d '\r' | base64 -d >"$work/out.tgz" \
  || { tail -30 "$work/console" >&2; exit 1; }
rm -rf "$out"; mkdir -p "$out"; tar -C "$out" -xzf "$work/out.tgz"
sed -n '/=====PLACEMENT=====/,/=====PLACEMENT-END=====/p' "$work/console" | sed '1d;$d' | tr -d '\r' | tr -s '\t' ' '
echo "captured $(find "$out" -type f -o -type l | wc -l) entries into $out"
