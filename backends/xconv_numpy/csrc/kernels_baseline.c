/* The baseline build of kernels.c (compiler flags: setup.py). */
#include "kernels.c"
