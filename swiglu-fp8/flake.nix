{
  description = "swiglu-fp8: SiLU(gate) * up (and GeGLU) + FP8 quantization in one pass";

  inputs.kernel-builder.url = "github:huggingface/kernels";

  outputs =
    { self, kernel-builder, ... }:
    kernel-builder.lib.genKernelFlakeOutputs {
      inherit self;
      path = ./.;
      pythonCheckInputs = pkgs: with pkgs; [ hypothesis pytest ];
    };
}
