#!/bin/bash
#SBATCH --job-name=ddp-resnet
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=64
#SBATCH --mem=512G
#SBATCH --time=2-00:00:00
#SBATCH --output=logs/%x-%j.out
#SBATCH --partition=gpu
#SBATCH --account=ml

source ~/venv/bin/activate
torchrun --standalone --nproc_per_node=8 train.py
