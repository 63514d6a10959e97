/* A stand-in libcuda.so for the --warm CUDA rule: a warm server that has it mapped may fork until
   the driver is initialised. As the real driver, cuCtxGetCurrent answers
   CUDA_ERROR_NOT_INITIALIZED (3) until cuInit(0) was called, then CUDA_SUCCESS with no context. */
static int initialised;

int cuInit(unsigned flags) {
  (void)flags;
  initialised = 1;
  return 0;
}

int cuCtxGetCurrent(void** ctx) {
  if (!initialised) return 3;
  *ctx = 0;
  return 0;
}

int ctrun_fake_libcuda_marker(void) { return 0; }
