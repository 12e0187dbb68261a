{
  description = "machete-w4a16: int4-weight x 16-bit-activation GEMM (W4A16) in Triton, with GPTQ / AWQ / compressed-tensors loaders";

  inputs.kernel-builder.url = "github:huggingface/kernels";

  outputs =
    { self, kernel-builder, ... }:
    kernel-builder.lib.genKernelFlakeOutputs {
      inherit self;
      path = ./.;
      pythonCheckInputs = pkgs: with pkgs; [ hypothesis pytest ];
    };
}
