"""PaddlePaddle adapter: float16 emulator, tracer, GradScaler, patches and sentinel for ``paddle.nn.Layer`` models."""
