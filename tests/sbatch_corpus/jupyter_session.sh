#!/bin/bash
#SBATCH --time=08:00:00
#SBATCH --job-name=jupyter
#SBATCH --output=jupyter-%j.log
#SBATCH --gres=gpu:1
#SBATCH --mem=32G
#SBATCH --cpus-per-task=4
jupyter lab --no-browser --ip=0.0.0.0 --port=8888
