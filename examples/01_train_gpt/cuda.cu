// The demo's CUDA build: the same source, compiled by nvcc (`./tide demo --backend cuda`).
#include "main.cpp"
