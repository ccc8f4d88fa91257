#!/bin/bash
#SBATCH -J llama-ft
#SBATCH --gres=gpu:a100:4
#SBATCH -c 32
#SBATCH --mem-per-gpu=64G
#SBATCH -t 12:00:00
#SBATCH --mail-type=END,FAIL
#SBATCH --mail-user=alice@uni.example
accelerate launch finetune.py --config cfg.yaml
