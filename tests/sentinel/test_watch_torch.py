"""ampsafe.watch on torch models: which op, which pass, which sample, overflow or numerical error."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

import ampsafe


class LogHead(nn.Module):
    def forward(self, x):
        return torch.log(x)  # log(0) where the ReLU before it clipped


class LogModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.act = nn.ReLU(inplace=True)
        self.head = LogHead()
        self.out = nn.Linear(4, 2)

    def forward(self, x):
        return self.out(self.head(self.act(self.fc(x))))


class Amplify(nn.Module):
    def __init__(self, factor):
        super().__init__()
        self.factor = factor

    def forward(self, x):
        return x * self.factor


class Overflowing(nn.Module):
    """Finite in float32; the second linear leaves float16 range under autocast."""

    def __init__(self, factor=100.0):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.amp = Amplify(factor)
        self.b = nn.Linear(8, 8)
        with torch.no_grad():
            self.b.weight.mul_(1e3)

    def forward(self, x):
        return self.b(self.amp(self.a(x)))


def test_genuine_log_of_zero_is_numerical_and_named():
    torch.manual_seed(0)
    model, x = LogModel(), torch.randn(6, 4)
    with pytest.raises(ampsafe.NonFiniteError) as info, ampsafe.watch(model):
        model(x)
    err = info.value
    assert (err.phase, err.module, err.op, err.kind) == ("forward", "head", "log", "numerical")
    with torch.no_grad():
        first_bad_row = int((~torch.isfinite(torch.log(torch.relu(model.fc(x))))).any(1).nonzero()[0])
    assert err.sample == first_bad_row
    assert err.stats["inputs"][0]["absmin"] == 0.0 and err.stats["outputs"][0]["inf"] > 0


def test_fp16_overflow_under_cpu_autocast_is_overflow_at_the_right_linear():
    torch.manual_seed(0)
    model, x = Overflowing(), torch.randn(4, 8)
    with torch.no_grad():
        assert torch.isfinite(model(x)).all()  # float32: fine
        assert model(x).abs().max() > 65504
    with pytest.raises(ampsafe.NonFiniteError) as info:
        with ampsafe.watch(model), torch.autocast("cpu", dtype=torch.float16):
            model(x)
    err = info.value
    assert (err.phase, err.module, err.op, err.kind) == ("forward", "b", "linear", "overflow")
    assert err.stats["rerun_float32_finite"] is True
    assert "float16" in str(err)


def test_bfloat16_is_not_overflow_where_float16_is():
    torch.manual_seed(0)
    model, x = Overflowing(), torch.randn(4, 8)
    with ampsafe.watch(model), torch.autocast("cpu", dtype=torch.bfloat16):
        model(x)  # bfloat16 has float32's range: nothing to report


def test_nan_in_input_is_kind_input_with_sample_index():
    torch.manual_seed(0)
    model, x = Overflowing(factor=1.0), torch.randn(5, 8)
    x[3, 2] = float("nan")
    with pytest.raises(ampsafe.NonFiniteError) as info, ampsafe.watch(model):
        model(x)
    err = info.value
    assert (err.phase, err.module, err.op, err.kind, err.sample) == ("forward", "a", "linear", "input", 3)
    assert "x[3]" in str(err)


def test_nan_weight_is_kind_parameter_naming_it():
    model, x = Overflowing(factor=1.0), torch.randn(2, 8)
    with torch.no_grad():
        model.b.weight[0, 0] = float("nan")
    with pytest.raises(ampsafe.NonFiniteError) as info, ampsafe.watch(model):
        model(x)
    assert (info.value.module, info.value.kind) == ("b", "parameter") and "b.weight" in str(info.value)


class SqrtModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.act = nn.ReLU(inplace=True)  # in-place: module backward hooks would choke on it
        self.out = nn.Linear(4, 1)

    def forward(self, x):
        return self.out(torch.sqrt(self.act(self.fc(x))))


def test_backward_nan_is_found_in_backward_phase_at_the_op_whose_gradient_blew_up():
    torch.manual_seed(0)
    model, x = SqrtModel(), torch.randn(6, 4)
    with ampsafe.watch(model):
        loss = model(x).sum()  # forward: finite (sqrt(0) = 0)
        with pytest.raises(ampsafe.NonFiniteError) as info:
            loss.backward()  # d sqrt / dx at 0 = inf
    err = info.value
    assert (err.phase, err.module, err.op, err.kind) == ("backward", "", "sqrt", "numerical")
    assert err.sample is not None


def test_backward_fp16_weight_gradient_overflow_is_overflow_at_the_linear_reading_the_big_input():
    torch.manual_seed(0)
    model = Overflowing(factor=1000.0)
    with torch.no_grad():
        model.b.weight.div_(1e3)
    x = torch.randn(4, 8)
    with ampsafe.watch(model, on_nonfinite="record") as w:
        with torch.autocast("cpu", dtype=torch.float16):
            out = model(x)
        (out.float().sum() * 100).backward()
    # b's input is ~1e3-1e4 (after amp's x1000), so its float16 weight gradient (100 * input) overflows first
    assert [(e.phase, e.module, e.op, e.kind) for e in w.events] == [("backward", "b", "linear", "overflow")]
    assert w.events[0].stats["arrived_finite"] is True


def test_record_mode_keeps_one_event_per_step_not_the_flood():
    torch.manual_seed(0)
    model, x = LogModel(), torch.randn(6, 4)
    with ampsafe.watch(model, on_nonfinite="record") as w:
        for _ in range(2):
            model(x).sum().backward()
    assert [(e.module, e.op) for e in w.events] == [("head", "log")] * 2


def test_no_hook_left_after_exit_even_on_exception(torch_hook_census):
    torch.manual_seed(0)
    model, x = LogModel(), torch.randn(6, 4)
    before = torch_hook_census(model)
    with ampsafe.watch(model, on_nonfinite="record", monitor_every=1):
        model(x).sum().backward()
    assert torch_hook_census(model) == before
    with pytest.raises(ampsafe.NonFiniteError), ampsafe.watch(model, monitor_every=1):
        model(x)
    assert torch_hook_census(model) == before
    with pytest.raises(ZeroDivisionError), ampsafe.watch(model, guard=True):
        model(torch.ones(2, 4))
        raise ZeroDivisionError
    assert torch_hook_census(model) == before
    with ampsafe.watch(model):  # and the watcher really was active meanwhile
        assert torch_hook_census(model) != before


class NormalizedByLog(nn.Module):
    """Divides each sample by log(max |x|): a sample whose max is exactly 1 divides by 0."""

    def forward(self, x):
        return x / torch.log(x.abs().amax(dim=(1, 2, 3), keepdim=True))


class GuardModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = NormalizedByLog()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.drop = nn.Dropout(0.5)
        self.fc = nn.Linear(8, 2)

    def forward(self, x):
        h = self.drop(torch.relu(self.bn(self.conv(self.stem(x)))))
        return self.fc(h.mean(dim=(2, 3)))


def test_guard_replays_the_same_step_exactly_and_localizes():
    torch.manual_seed(0)
    model = GuardModel().train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rng_at_dropout = []
    model.drop.register_forward_pre_hook(lambda m, i: rng_at_dropout.append(torch.get_rng_state()))
    batches = [torch.rand(4, 3, 8, 8) * 0.9 + 0.05 for _ in range(3)]
    batches[2][1] = 1.0  # max |x| == 1 -> log(1) == 0 -> x / 0
    events = []
    with ampsafe.watch(model, guard=True, on_nonfinite="record", callback=events.append) as w:
        for step, x in enumerate(batches):
            stats_before = model.bn.running_mean.clone()
            rng_at_dropout.clear()
            loss = model(x).square().mean()
            loss.backward()
            ok = w.check(loss, replay=lambda x=x: model(x).square().mean())
            if ok:
                opt.step()
            opt.zero_grad()
            assert ok == (step != 2)
    err = w.events[0]
    assert events == [err] and len(w.events) == 1
    assert (err.phase, err.module, err.op, err.kind, err.sample) == ("forward", "stem", "div", "numerical", 1)
    assert "step 2" in str(err)
    # the replay drew the same dropout mask: the RNG was where it was when the bad step started
    assert len(rng_at_dropout) == 2 and torch.equal(rng_at_dropout[0], rng_at_dropout[1])
    assert torch.equal(model.bn.running_mean, stats_before)  # the bad step left BatchNorm untouched


def test_guard_without_replay_still_reports_and_raises():
    model = GuardModel()
    x = torch.rand(2, 3, 8, 8) * 0.5
    x[0] = 1.0
    with ampsafe.watch(model, guard=True) as w:
        loss = model(x).sum()
        loss.backward()
        with pytest.raises(ampsafe.NonFiniteError) as info:
            w.check(loss)
    assert (info.value.phase, info.value.kind, info.value.op) == ("forward", "unknown", "loss")


def test_guard_on_clean_steps_checks_without_reporting():
    torch.manual_seed(0)
    model, x = GuardModel(), torch.rand(2, 3, 8, 8) * 0.5
    with ampsafe.watch(model, guard=True) as w:
        loss = model(x).sum()
        loss.backward()
        assert w.check(loss) and not w.events


def _growing_net():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 1, 3, padding=1),
    )


def test_monitor_warns_before_activations_leave_float16_range(caplog):
    net = _growing_net()
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    x = torch.rand(4, 3, 16, 16)
    true_amax = []
    seen = []
    with caplog.at_level(logging.WARNING, logger="ampsafe.watch"):
        with ampsafe.watch(net, monitor_every=10, margin_bits=4.0, callback=seen.append) as w:
            for _ in range(70):
                out = net(x)
                true_amax.append(float(out.detach().abs().max()))
                (-out.mean()).backward()  # unbounded objective, no normalization: activations grow
                opt.step()
                opt.zero_grad()
    overflow_step = next(i for i, a in enumerate(true_amax) if a > 65504)
    assert w.warnings, "no headroom warning"
    first = w.warnings[0]
    assert first.step % 10 == 0 and first.step < overflow_step
    assert first.headroom_bits < 4.0 and first.amax < 65504
    assert first.start in {"0", "2", "4"} and "ampsafe.patch" in first.message
    assert seen[0] is first and any("headroom" in r.message for r in caplog.records)
    # it warned as soon as a monitored step saw less than 4 bits, not later
    assert first.step - 10 < next(i for i, a in enumerate(true_amax) if a > 65504 / 16) <= first.step


def test_bad_options_are_config_errors():
    with pytest.raises(ampsafe.ConfigError):
        ampsafe.watch(LogModel(), on_nonfinite="ignore")
    with pytest.raises(ampsafe.ConfigError):
        ampsafe.watch(LogModel(), monitor_every=0)
    with pytest.raises(ampsafe.UnsupportedModelError):
        ampsafe.watch(object())


def test_guard_in_raise_mode_raises_the_localized_error_and_puts_gradients_back():
    torch.manual_seed(0)
    model = GuardModel().train()
    x = torch.rand(3, 3, 8, 8) * 0.5
    x[2] = 1.0
    with ampsafe.watch(model, guard=True) as w:
        loss = model(x).sum()
        loss.backward()
        grads = [p.grad for p in model.parameters()]
        with pytest.raises(ampsafe.NonFiniteError) as info:
            w.check(loss, replay=lambda: model(x).sum())
    assert (info.value.module, info.value.op, info.value.kind, info.value.sample) == ("stem", "div", "numerical", 2)
    assert all(p.grad is g for p, g in zip(model.parameters(), grads))
