{
  description = "rope-triton: rotary embeddings and the fused RMSNorm -> matmul -> RoPE projection, in Triton";

  inputs.kernel-builder.url = "github:huggingface/kernels";

  outputs =
    { self, kernel-builder, ... }:
    kernel-builder.lib.genKernelFlakeOutputs {
      inherit self;
      path = ./.;
      pythonCheckInputs = pkgs: with pkgs; [ hypothesis pytest ];
    };
}
