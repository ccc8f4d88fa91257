#!/bin/bash
#SBATCH -n 16
mpirun ./solver
