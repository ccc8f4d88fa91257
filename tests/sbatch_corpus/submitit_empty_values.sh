#!/bin/bash

# Parameters
#SBATCH --cpus-per-task=10
#SBATCH --error=/home/alice/logs/%j_0_log.err
#SBATCH --exclude=''
#SBATCH --gpus-per-node=1
#SBATCH --job-name=''
#SBATCH --mem=0
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --open-mode=append
#SBATCH --output=/home/alice/logs/%j_0_log.out
#SBATCH --partition=''
#SBATCH --signal=USR2@90
#SBATCH --time=60
#SBATCH --wckey=submitit

# command
export SUBMITIT_EXECUTOR=slurm
srun --unbuffered --output /home/alice/logs/%j_%t_log.out python -u -m submitit.core._submit /home/alice/logs
