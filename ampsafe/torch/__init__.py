"""PyTorch adapter: tracer, GradScaler, patches and sentinel for ``torch.nn.Module`` models."""
