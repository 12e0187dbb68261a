{
  description = "gated-mlp: the up-projection GEMM of a gated MLP with SwiGLU / GeGLU fused in its epilogue, in Triton, plus a CuTe sm80 kernel";

  inputs.kernel-builder.url = "github:huggingface/kernels";

  outputs =
    { self, kernel-builder, ... }:
    kernel-builder.lib.genKernelFlakeOutputs {
      inherit self;
      path = ./.;
      pythonCheckInputs = pkgs: with pkgs; [ hypothesis pytest ];
    };
}
