#!/bin/bash
#SBATCH --job-name=checkpointed
#SBATCH --gres=gpu:1
#SBATCH --time=04:00:00
#SBATCH --signal=B:USR1@300
# The shell traps USR1, writes a checkpoint and requeues itself.
trap 'kill -USR1 "$child"; wait "$child"; scontrol requeue "$SLURM_JOB_ID"' USR1
python train.py --resume &
child=$!
wait "$child"
