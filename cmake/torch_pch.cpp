// The translation unit that builds the shared LibTorch precompiled headers (cmake/TorchPch.cmake);
// it has no code of its own.
