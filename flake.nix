{
  description = "fused-llm: fused GPU kernels for LLM inference, one kernel-builder package per directory";

  inputs.kernel-builder.url = "github:huggingface/kernels";

  # One output per kernel package: `nix build .#rmsnorm-fp8` builds that package's bundle
  # (every variant kernel-builder targets); `nix build .#rmsnorm-fp8-redistributable` its
  # redistributable variants; `nix run .#rmsnorm-fp8-ci-test` its kernels_ci tests. Each
  # package directory also has its own flake.nix, so `cd rmsnorm-fp8 && kernel-builder build`
  # works as in kernels-community.
  outputs =
    { self, kernel-builder, ... }:
    let
      inherit (kernel-builder.inputs.nixpkgs) lib;
      kernelPackages = [
        "rmsnorm-fp8"
        "swiglu-fp8"
        "rope-triton"
        "gated-mlp"
        "machete-w4a16"
        "skinny-gemm"
      ];
      perPackage = lib.genAttrs kernelPackages (
        name:
        kernel-builder.lib.genKernelFlakeOutputs {
          inherit self;
          path = ./. + "/${name}";
          pythonCheckInputs = pkgs: with pkgs; [ hypothesis pytest ];
        }
      );
      systems = builtins.attrNames perPackage."rmsnorm-fp8".packages;
      outputsFor =
        system:
        lib.concatMapAttrs (name: outs: {
          ${name} = outs.packages.${system}.default;
          "${name}-redistributable" = outs.packages.${system}.redistributable;
          "${name}-ci-test" = outs.packages.${system}.ci-test;
        }) perPackage;
    in
    {
      packages = lib.genAttrs systems outputsFor;
      devShells = lib.genAttrs systems (
        system: lib.mapAttrs (name: outs: outs.devShells.${system}.default) perPackage
      );
    };
}
