{
  description = "skinny-gemm: split-K, swap-AB GEMM for decode-sized batches (bf16 / fp16 / FP8) in Triton and a Hopper TMA kernel, with a dispatching linear";

  inputs.kernel-builder.url = "github:huggingface/kernels";

  outputs =
    { self, kernel-builder, ... }:
    kernel-builder.lib.genKernelFlakeOutputs {
      inherit self;
      path = ./.;
      pythonCheckInputs = pkgs: with pkgs; [ hypothesis pytest ];
    };
}
