#!/bin/sh
# Device confinement on a real NVIDIA host with cgroup v2: read-only on the GPUs.
#
#   sudo bench/gpu_v2_check.sh            (from a checkout with its venv in .venv)
#
# Starts `gpud standalone` with the NVML backend in a temporary directory, runs one job
# given no GPU that tries to open /dev/nvidia0 (it must fail with EPERM) and one given
# GPU 0 that opens it (it must succeed), prints what each saw and a verdict, and stops the
# cluster.  It never changes MIG mode, clocks, compute mode or anything else on a GPU: it
# configures no [worker] gpu_modes, and the jobs only open and close the device node.
set -eu

here=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-$here/.venv/bin/python}
[ "$(id -u)" = 0 ] || { echo "gpu_v2_check: run as root (only a root worker confines jobs)" >&2; exit 2; }
[ -e /sys/fs/cgroup/cgroup.controllers ] || { echo "gpu_v2_check: this host does not run cgroup v2" >&2; exit 2; }
[ -e /dev/nvidia0 ] || { echo "gpu_v2_check: no /dev/nvidia0 here" >&2; exit 2; }

dir=$(mktemp -d /tmp/gpu-v2-check.XXXXXX)
chmod 755 "$dir"
pid=
cleanup() {
    [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    rm -rf "$dir"
}
trap cleanup EXIT INT TERM

cat > "$dir/gpud.toml" <<TOML
state_dir = "$dir/state"
key_file = "$dir/cluster.key"
[head]
socket = "$dir/gpud.sock"
[worker]
cgroups = "v2"
TOML
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
"$py" -m gpud.cli keygen "$dir/cluster.key" >/dev/null
"$py" -m gpud.cli standalone --config "$dir/gpud.toml" --socket "$dir/gpud.sock" --key-file "$dir/cluster.key" --name gpucheck > "$dir/standalone.log" 2>&1 &
pid=$!

gpuctl() { "$py" -m gpuctl.main --socket "$dir/gpud.sock" "$@"; }
i=0
until gpuctl sinfo -h 2>/dev/null | grep -q .; do
    i=$((i + 1))
    [ $i -lt 120 ] || { echo "gpu_v2_check: standalone did not come up:" >&2; tail -20 "$dir/standalone.log" >&2; exit 1; }
    kill -0 "$pid" 2>/dev/null || { tail -20 "$dir/standalone.log" >&2; exit 1; }
    sleep 0.5
done
node=$(gpuctl scontrol show node gpucheck)
echo "$node" | grep -o 'Confinement=[a-z0-9]*'

probe='import errno, os
try:
    os.close(os.open("/dev/nvidia0", os.O_RDWR)); print("open /dev/nvidia0: ok")
except OSError as e:
    print("open /dev/nvidia0:", errno.errorcode.get(e.errno, e.errno))'
none=$(gpuctl sbatch --parsable -D "$dir" -o none.out --wrap "unset CUDA_VISIBLE_DEVICES; $py -c '$probe'")
one=$(gpuctl sbatch --parsable --gpus=1 -D "$dir" -o one.out --wrap "echo GPUD_GPUS=\$GPUD_GPUS; $py -c '$probe'")
for j in "$none" "$one"; do
    i=0
    while gpuctl squeue -h -j "$j" 2>/dev/null | grep -q .; do
        i=$((i + 1)); [ $i -lt 240 ] || { echo "gpu_v2_check: job $j did not end" >&2; exit 1; }
        sleep 0.5
    done
done
echo "job $none (no GPU):"; sed 's/^/  /' "$dir/none.out"
echo "job $one (1 GPU):";   sed 's/^/  /' "$dir/one.out"
gpuctl sacct -j "$none,$one" -o JobID,State,ExitCode,AllocGPUS
ok=1
grep -q "open /dev/nvidia0: EPERM" "$dir/none.out" || ok=0
grep -q "GPUD_GPUS=0$" "$dir/one.out" && { grep -q "open /dev/nvidia0: ok" "$dir/one.out" || ok=0; } \
    || echo "note: the 1-GPU job got another GPU than 0; it should then get EPERM on /dev/nvidia0"
echo "host: $(uname -n) $(uname -r), $(date -u +%Y-%m-%dT%H:%MZ), driver $(cat /proc/driver/nvidia/version 2>/dev/null | head -1 | sed 's/.*Kernel Module *//;s/ .*//')"
if [ $ok = 1 ]; then echo "PASS: a job given no GPU cannot open /dev/nvidia0, a job given GPU 0 can"; else echo "FAIL"; exit 1; fi
