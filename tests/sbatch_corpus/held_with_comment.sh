#!/bin/bash
#SBATCH -H
#SBATCH --comment="waiting for data"
#SBATCH -q low --nice=100
./process.sh
