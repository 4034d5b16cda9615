"""MultigridBatchNorm: split, sync and plain modes against nn.BatchNorm; module surgery."""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from lightning_multigrid.norm import (
    MultigridBatchNorm,
    apply_bn_plan,
    convert_batchnorm,
    create_sync_groups,
    get_sync_group,
    revert_batchnorm,
)
from lightning_multigrid.schedule import BNPlan

C = 3


def _layer(num_splits: int = 1, dtype: torch.dtype = torch.float64, **kwargs: object) -> MultigridBatchNorm:
    torch.manual_seed(1)
    layer = MultigridBatchNorm(C, num_splits=num_splits, dtype=dtype, **kwargs)  # type: ignore[arg-type]
    if layer.affine:
        with torch.no_grad():
            layer.weight.normal_()
            layer.bias.normal_()
    return layer


def _input(n: int, spatial: tuple[int, ...], dtype: torch.dtype = torch.float64) -> torch.Tensor:
    torch.manual_seed(0)
    # Per-channel offsets and scales, so wrong grouping or a missing term shows.
    shape = (1, C) + (1,) * len(spatial)
    return torch.randn(n, C, *spatial, dtype=dtype) * torch.rand(shape, dtype=dtype) * 3 + torch.randn(shape, dtype=dtype)


def _group_reference(x: torch.Tensor, layer: MultigridBatchNorm, num_groups: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A separate nn.BatchNorm per interleaved group (sharing the layer's weight and bias).

    Returns the output and the per-group means and unbiased variances, each (num_groups, C).
    """
    out = torch.empty_like(x)
    means, variances = [], []
    for j in range(num_groups):
        group = x[j::num_groups]
        reference = nn.BatchNorm1d(C, dtype=x.dtype)
        reference.weight, reference.bias = layer.weight, layer.bias
        out[j::num_groups] = reference(group.reshape(group.shape[0], C, -1)).view_as(group)
        values = group.transpose(0, 1).reshape(C, -1).detach()
        means.append(values.mean(1))
        variances.append(values.var(1))  # unbiased, as nn.BatchNorm's running_var
    return out, torch.stack(means), torch.stack(variances)


# (batch size, num_splits, positions per sample): divisible, not divisible, N < k, video-shaped.
SPLIT_CASES = [
    (8, 1, (4,)),
    (8, 2, (4,)),
    (16, 4, (2, 3)),
    (32, 8, (2, 2, 2)),
    (10, 4, (2, 3)),  # groups of 3, 3, 2, 2
    (13, 8, (2, 2, 2)),  # groups of 2 x 5 and 1 x 3
    (3, 8, (2, 2, 2)),  # N < k: three groups of one clip each
    (9, 2, ()),  # (N, C) input, groups of 5 and 4
]


@pytest.mark.parametrize(("n", "k", "spatial"), SPLIT_CASES)
def test_split_equals_separate_batchnorm_per_group(n: int, k: int, spatial: tuple[int, ...]) -> None:
    layer = _layer(k)
    x = _input(n, spatial).requires_grad_()
    grad = torch.randn_like(x)
    y = layer(x)
    (y * grad).sum().backward()
    assert x.grad is not None and layer.weight.grad is not None and layer.bias.grad is not None
    got = (x.grad.clone(), layer.weight.grad.clone(), layer.bias.grad.clone())

    groups = min(k, n)
    x_ref = x.detach().clone().requires_grad_()
    weight = layer.weight.detach().clone().requires_grad_()
    bias = layer.bias.detach().clone().requires_grad_()
    reference_layer = _layer(k)
    reference_layer.weight, reference_layer.bias = nn.Parameter(weight), nn.Parameter(bias)
    expected, means, variances = _group_reference(x_ref, reference_layer, groups)
    (expected * grad).sum().backward()

    torch.testing.assert_close(y, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[0], x_ref.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[1], reference_layer.weight.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[2], reference_layer.bias.grad, atol=1e-5, rtol=1e-5)

    # Running statistics: one momentum update with the aggregate of the groups.
    mean = means.mean(0)
    var = variances.mean(0) + (means - mean).pow(2).mean(0)
    torch.testing.assert_close(layer.running_mean, 0.9 * torch.zeros(C, dtype=x.dtype) + 0.1 * mean)
    torch.testing.assert_close(layer.running_var, 0.9 * torch.ones(C, dtype=x.dtype) + 0.1 * var)
    assert layer.num_batches_tracked.item() == 1


@pytest.mark.parametrize("momentum", [0.1, None])
@pytest.mark.parametrize("spatial", [(), (5,), (2, 3), (2, 3, 4)])
def test_plain_and_k1_are_exactly_nn_batchnorm(momentum: float | None, spatial: tuple[int, ...]) -> None:
    reference_cls = {0: nn.BatchNorm1d, 1: nn.BatchNorm1d, 2: nn.BatchNorm2d, 3: nn.BatchNorm3d}[len(spatial)]
    reference = reference_cls(C, momentum=momentum)
    layer = MultigridBatchNorm(C, momentum=momentum, num_splits=1)
    layer.load_state_dict(reference.state_dict())
    for step in range(3):
        x = _input(6 + step, spatial, torch.float32)
        assert torch.equal(layer(x), reference(x))
    for name, tensor in reference.state_dict().items():
        assert torch.equal(layer.state_dict()[name], tensor), name
    assert layer.num_batches_tracked.item() == 3
    layer.eval()
    reference.eval()
    x = _input(4, spatial, torch.float32)
    assert torch.equal(layer(x), reference(x))


def test_eval_ignores_grouping() -> None:
    reference = nn.BatchNorm3d(C)
    reference.running_mean.uniform_()
    reference.running_var.uniform_(0.5, 2)
    layer = MultigridBatchNorm.from_batchnorm(reference)
    layer.num_splits = 4
    layer.eval()
    reference.eval()
    x = _input(8, (2, 2, 2), torch.float32)
    assert torch.equal(layer(x), reference(x))
    # Without running statistics eval normalises with the whole batch, as nn.BatchNorm does.
    untracked = MultigridBatchNorm(C, track_running_stats=False, num_splits=4).eval()
    assert torch.equal(untracked(x), nn.BatchNorm3d(C, track_running_stats=False).eval()(x))


@pytest.mark.parametrize("n", [12, 10])
def test_split_without_running_stats_or_affine(n: int) -> None:
    layer = _layer(4, affine=False, track_running_stats=False)
    x = _input(n, (3,)).requires_grad_()
    expected, _, _ = _group_reference(x, layer, 4)
    torch.testing.assert_close(layer(x), expected)
    assert layer.running_mean is None and layer.num_batches_tracked is None
    assert torch.autograd.gradcheck(layer, (x,))


def test_split_momentum_none_is_a_cumulative_average_of_the_aggregates() -> None:
    layer = _layer(2, momentum=None)
    aggregates = []
    for n in (8, 7):  # an even and an uneven split
        x = _input(n, (3,)) * n
        layer(x)
        _, means, variances = _group_reference(x, layer, 2)
        mean = means.mean(0)
        aggregates.append((mean, variances.mean(0) + (means - mean).pow(2).mean(0)))
    torch.testing.assert_close(layer.running_mean, (aggregates[0][0] + aggregates[1][0]) / 2)
    torch.testing.assert_close(layer.running_var, (aggregates[0][1] + aggregates[1][1]) / 2)


@pytest.mark.parametrize(("n", "k"), [(8, 1), (8, 4), (7, 3), (3, 4)])
def test_split_gradcheck(n: int, k: int) -> None:
    layer = _layer(k, track_running_stats=False)
    x = _input(n, (2, 2)).requires_grad_()
    weight = layer.weight.detach().clone().requires_grad_()
    bias = layer.bias.detach().clone().requires_grad_()

    def function(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(layer, {"weight": weight, "bias": bias}, (x,))

    assert torch.autograd.gradcheck(function, (x, weight, bias))


@pytest.mark.parametrize("n", [8, 10])
def test_split_accepts_any_input_and_gradient_layout(n: int) -> None:
    layer = _layer(4)
    x = _input(n, (2, 3, 4)).to(memory_format=torch.channels_last_3d).requires_grad_()
    layer(x).sum().backward()  # the output's gradient is an expanded (stride 0) tensor
    reference = x.detach().clone().requires_grad_()
    expected, _, _ = _group_reference(reference, _layer(4), 4)
    expected.sum().backward()
    torch.testing.assert_close(layer(x), expected)
    torch.testing.assert_close(x.grad, reference.grad)


@pytest.mark.parametrize(("n", "k"), [(8, 4), (10, 4), (3, 8)])
@pytest.mark.parametrize("spatial", [(2, 3, 4), (3, 4)])
def test_split_keeps_the_channels_last_layout(n: int, k: int, spatial: tuple[int, ...]) -> None:
    # A channels_last(_3d) network must not get NC... output (a copy per layer on GPU).
    memory_format = torch.channels_last_3d if len(spatial) == 3 else torch.channels_last
    layer, reference_layer = _layer(k), _layer(k)
    x = _input(n, spatial).contiguous(memory_format=memory_format).requires_grad_()
    reference = x.detach().contiguous().requires_grad_()
    grad = torch.randn(x.shape, dtype=x.dtype).contiguous(memory_format=memory_format)
    y = layer(x)
    expected = reference_layer(reference)
    assert y.is_contiguous(memory_format=memory_format)
    torch.testing.assert_close(y, expected)
    (y * grad).sum().backward()
    (expected * grad).sum().backward()
    assert x.grad is not None and x.grad.is_contiguous(memory_format=memory_format)
    torch.testing.assert_close(x.grad, reference.grad)
    torch.testing.assert_close(layer.weight.grad, reference_layer.weight.grad)
    torch.testing.assert_close(layer.running_mean, reference_layer.running_mean)
    torch.testing.assert_close(layer.running_var, reference_layer.running_var)


@pytest.mark.parametrize("n", [2, 3, 5])
def test_single_value_groups_never_nan(n: int) -> None:
    # (N, C) input with N < 2k: one sample per group would have no variance; groups are merged.
    layer = _layer(8)
    x = _input(n, ())
    y = layer(x)
    assert torch.isfinite(y).all()
    assert torch.isfinite(layer.running_var).all()
    expected, _, _ = _group_reference(x, layer, n // 2)
    torch.testing.assert_close(y, expected)


def test_one_value_per_channel_raises_like_batchnorm() -> None:
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        _layer(4)(_input(1, ()))


def test_changing_grouping_allocates_nothing() -> None:
    layer = _layer(1)
    parameters = {name: (id(p), p.data_ptr()) for name, p in layer.named_parameters()}
    buffers = {name: (id(b), b.data_ptr()) for name, b in layer.named_buffers()}
    shapes = {name: t.shape for name, t in layer.state_dict().items()}
    for k in (1, 8, 4, 2, 1, 3):
        layer.num_splits = k
        layer(_input(16, (2, 2)))
        assert {name: (id(p), p.data_ptr()) for name, p in layer.named_parameters()} == parameters
        assert {name: (id(b), b.data_ptr()) for name, b in layer.named_buffers()} == buffers
        assert {name: t.shape for name, t in layer.state_dict().items()} == shapes
    assert layer.num_batches_tracked.item() == 6


def test_invalid_grouping_and_input() -> None:
    layer = MultigridBatchNorm(C)
    with pytest.raises(ValueError, match="`num_splits` must be an integer >= 1, got 0"):
        layer.set_grouping(num_splits=0)
    layer.num_splits = 2.0  # type: ignore[assignment]
    with pytest.raises(ValueError, match="`num_splits` must be an integer"):
        layer(_input(4, (2,), torch.float32))
    with pytest.raises(ValueError, match="6D input"):
        MultigridBatchNorm(C).eval()(torch.zeros(1, C, 1, 1, 1, 1))
    with pytest.raises(ValueError, match="both set"):
        MultigridBatchNorm(C).set_grouping(2, object())  # type: ignore[arg-type]


# --------------------------------------------------------------------------- plans, process groups


def test_apply_bn_plan_configures_every_layer() -> None:
    model = convert_batchnorm(nn.Sequential(nn.Conv3d(3, C, 1), nn.BatchNorm3d(C), nn.Sequential(nn.BatchNorm3d(C))))
    assert apply_bn_plan(model, BNPlan("split", num_splits=4)) == 2
    assert [m.mode for m in model.modules() if isinstance(m, MultigridBatchNorm)] == ["split", "split"]
    assert apply_bn_plan(model, BNPlan("sync", group_size=1)) == 2  # a group of one rank: no sync
    assert all(m.mode == "plain" and m.num_splits == 1 for m in model.modules() if isinstance(m, MultigridBatchNorm))
    assert apply_bn_plan(nn.Sequential(nn.BatchNorm3d(C)), BNPlan("split", num_splits=2)) == 0


def test_sync_without_distributed_or_on_one_rank_is_a_clear_error(tmp_path: Path) -> None:
    import torch.distributed as dist

    model = convert_batchnorm(nn.BatchNorm3d(C))
    with pytest.raises(ValueError, match="`group_size` must be a positive integer, got 0"):
        get_sync_group(0)
    assert get_sync_group(1) is None
    owned = not dist.is_initialized()  # a one-device DDP Trainer in another test may have left one
    if owned:
        with pytest.raises(ValueError, match="`group_size`=2 ranks needs torch.distributed"):
            apply_bn_plan(model, BNPlan("sync", group_size=2))
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        assert dist.get_world_size() == 1
        with pytest.raises(ValueError, match="single rank"):
            apply_bn_plan(model, BNPlan("sync", group_size=2))
        assert apply_bn_plan(model, BNPlan("sync", group_size=1)) == 1
    finally:
        if owned:
            dist.destroy_process_group()


SYNC_CASES = (("even", [4, 4, 4, 4]), ("uneven", [3, 5, 2, 6]))  # clips per rank


def _sync_data(sizes: list[int]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    torch.manual_seed(0)
    xs = [torch.randn(n, 3, 2, 3, 3, dtype=torch.float64) * 2 + 1 for n in sizes]
    return xs, [torch.randn_like(x) for x in xs]


def _sync_worker(rank: int, world_size: int, store: str, out: str) -> None:
    """One rank: two training steps of a MultigridBatchNorm per (group size, batch sizes) case."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world_size)
    create_sync_groups([2, 1, world_size])
    assert get_sync_group(2) is get_sync_group(2)  # cached, not created again
    results = {}
    for group_size in (1, 2):
        for name, sizes in SYNC_CASES:
            xs, grads = _sync_data(sizes[:world_size])
            layer = _layer(1)
            apply_bn_plan(layer, BNPlan("sync", group_size=group_size))
            assert layer.mode == ("sync" if group_size > 1 else "plain")
            x = xs[rank].clone().requires_grad_()
            for _ in range(2):
                x.grad = None
                layer.zero_grad()
                y = layer(x)
                (y * grads[rank]).sum().backward()
            results[(group_size, name)] = {
                "y": y.detach(), "x_grad": x.grad, "weight_grad": layer.weight.grad,
                "bias_grad": layer.bias.grad, **layer.state_dict(),
            }
    torch.save(results, out)
    dist.barrier()
    dist.destroy_process_group()


def _start_processes(target: object, args_per_rank: list[tuple], preload: list[str]) -> list:
    """Start one process per rank from a forkserver.

    Not plain fork: another test may leave a process group (and gloo's threads) in the pytest
    process, and a forked child can deadlock on a lock one of those threads held. The forkserver
    is a fresh interpreter (with ``preload`` imported once), so children start clean and fast.
    """
    context = torch.multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(preload)
    workers = [context.Process(target=target, args=args) for args in args_per_rank]
    for worker in workers:
        worker.start()
    return workers


def _run_sync_workers(tmp_path: Path, world_size: int) -> list[dict]:
    outs = [tmp_path / f"rank{rank}.pt" for rank in range(world_size)]
    store = str(tmp_path / "store")
    workers = _start_processes(
        _sync_worker, [(rank, world_size, store, str(outs[rank])) for rank in range(world_size)],
        preload=["torch", "lightning_multigrid.norm"],
    )
    for worker in workers:
        worker.join(timeout=120)
    for rank, worker in enumerate(workers):
        if worker.is_alive():
            worker.kill()
        assert worker.exitcode == 0, f"rank {rank} exited with {worker.exitcode} (its traceback is above)"
    return [torch.load(out) for out in outs]


def _check_sync_results(results: list[dict], world_size: int) -> None:
    for group_size in (1, 2):
        for name, all_sizes in SYNC_CASES:
            sizes = all_sizes[:world_size]
            xs, grads = _sync_data(sizes)
            for start in range(0, world_size, group_size):
                ranks = range(start, start + group_size)
                # Plain BN on the concatenated batch of the group, two steps as in the workers.
                reference = nn.BatchNorm3d(3, dtype=torch.float64)
                x = torch.cat([xs[r] for r in ranks]).requires_grad_()
                grad = torch.cat([grads[r] for r in ranks])
                with torch.no_grad():
                    reference.weight.copy_(results[start][(group_size, name)]["weight"])
                    reference.bias.copy_(results[start][(group_size, name)]["bias"])
                for _ in range(2):
                    x.grad = None
                    reference.zero_grad()
                    y = reference(x)
                    (y * grad).sum().backward()
                offsets = [0]
                for r in ranks:
                    offsets.append(offsets[-1] + sizes[r])
                weight_grad = sum(results[r][(group_size, name)]["weight_grad"] for r in ranks)
                bias_grad = sum(results[r][(group_size, name)]["bias_grad"] for r in ranks)
                torch.testing.assert_close(weight_grad, reference.weight.grad)
                torch.testing.assert_close(bias_grad, reference.bias.grad)
                for i, r in enumerate(ranks):
                    got = results[r][(group_size, name)]
                    torch.testing.assert_close(got["y"], y[offsets[i] : offsets[i + 1]].detach())
                    torch.testing.assert_close(got["x_grad"], x.grad[offsets[i] : offsets[i + 1]])
                    torch.testing.assert_close(got["running_mean"], reference.running_mean)
                    torch.testing.assert_close(got["running_var"], reference.running_var)
                    assert got["num_batches_tracked"].item() == 2
                    # Every rank of a group holds bit-identical running statistics.
                    first = results[start][(group_size, name)]
                    assert torch.equal(got["running_mean"], first["running_mean"])
                    assert torch.equal(got["running_var"], first["running_var"])


needs_forkserver = pytest.mark.skipif(
    "forkserver" not in torch.multiprocessing.get_all_start_methods(), reason="needs forkserver (POSIX)"
)


@needs_forkserver
def test_sync_two_ranks_gloo(tmp_path: Path) -> None:
    _check_sync_results(_run_sync_workers(tmp_path, world_size=2), world_size=2)


@needs_forkserver
def test_sync_groups_of_two_among_four_ranks_gloo(tmp_path: Path) -> None:
    # Groups [0, 1] and [2, 3] come from new_group (not the world group): statistics stay inside.
    _check_sync_results(_run_sync_workers(tmp_path, world_size=4), world_size=4)


def _autocast_sync_worker(rank: int, store: str, out: str) -> None:
    """One of 2 ranks: a float32 layer syncing over both on bfloat16 channels_last input (autocast)."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    xs, grads = _sync_data([4, 6])
    layer = _layer(1, dtype=torch.float32)
    apply_bn_plan(layer, BNPlan("sync", group_size=2))
    x = xs[rank].to(torch.bfloat16).contiguous(memory_format=torch.channels_last_3d).requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
    (y.float() * grads[rank]).sum().backward()
    torch.save({"y": y.detach(), "channels_last": y.is_contiguous(memory_format=torch.channels_last_3d),
                "x_grad": x.grad, "weight_grad": layer.weight.grad, **layer.state_dict()}, out)
    dist.barrier()
    dist.destroy_process_group()


@needs_forkserver
def test_sync_under_bf16_autocast_two_ranks_gloo(tmp_path: Path) -> None:
    # Mixed precision: half input, float32 statistics, weight and bias (used to raise "mixed dtype").
    outs = [tmp_path / f"rank{rank}.pt" for rank in range(2)]
    workers = _start_processes(
        _autocast_sync_worker, [(rank, str(tmp_path / "store"), str(outs[rank])) for rank in range(2)],
        preload=["torch", "lightning_multigrid.norm"],
    )
    for worker in workers:
        worker.join(timeout=120)
    for rank, worker in enumerate(workers):
        if worker.is_alive():
            worker.kill()
        assert worker.exitcode == 0, f"rank {rank} exited with {worker.exitcode} (its traceback is above)"
    results = [torch.load(out) for out in outs]
    # Reference: plain BatchNorm in float64 over both ranks' (bfloat16-rounded) inputs.
    xs, grads = _sync_data([4, 6])
    reference = nn.BatchNorm3d(C, dtype=torch.float64)
    layer = _layer(1, dtype=torch.float32)
    with torch.no_grad():
        reference.weight.copy_(layer.weight)
        reference.bias.copy_(layer.bias)
    x = torch.cat([x.to(torch.bfloat16).double() for x in xs]).requires_grad_()
    y = reference(x)
    (y * torch.cat(grads)).sum().backward()
    for rank, got in enumerate(results):
        rows = slice(0, 4) if rank == 0 else slice(4, 10)
        assert got["y"].dtype == torch.bfloat16 and got["channels_last"]
        torch.testing.assert_close(got["y"].double(), y[rows].detach(), rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(got["x_grad"].double(), x.grad[rows], rtol=2e-2, atol=5e-2)
        torch.testing.assert_close(got["running_mean"].double(), reference.running_mean, rtol=1e-3, atol=1e-3)
        torch.testing.assert_close(got["running_var"].double(), reference.running_var, rtol=1e-3, atol=1e-3)
    weight_grad = results[0]["weight_grad"] + results[1]["weight_grad"]
    torch.testing.assert_close(weight_grad.double(), reference.weight.grad, rtol=1e-2, atol=1e-2)
    assert torch.equal(results[0]["running_var"], results[1]["running_var"])


# --------------------------------------------------------------------------- module surgery


def test_convert_and_revert_keep_the_same_tensors() -> None:
    model = nn.Sequential(nn.Conv2d(3, C, 1), nn.BatchNorm2d(C), nn.ReLU(), nn.Sequential(nn.BatchNorm1d(C)))
    tensors = {name: t for name, t in model.state_dict(keep_vars=True).items()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    original = model[1]
    converted = convert_batchnorm(model)
    assert converted is model
    assert isinstance(model[1], MultigridBatchNorm) and isinstance(model[3][0], MultigridBatchNorm)
    assert isinstance(model[1], _BatchNorm)
    assert all(model.state_dict(keep_vars=True)[name] is t for name, t in tensors.items())
    assert list(model.state_dict()) == list(tensors)
    # The optimizer built before the conversion still trains the converted layers.
    before = model[1].weight.detach().clone()
    # Squared: the weight gradient of a plain sum of BatchNorm outputs is zero up to round-off.
    model(torch.randn(4, 3, 2, 2)).pow(2).sum().backward()
    optimizer.step()
    assert not torch.equal(model[1].weight, before)
    assert convert_batchnorm(model) is model and isinstance(model[1], MultigridBatchNorm)  # idempotent

    reverted = revert_batchnorm(model)
    assert reverted is model and model[1] is original and type(model[3][0]) is nn.BatchNorm1d
    assert all(model.state_dict(keep_vars=True)[name] is t for name, t in tensors.items())


def test_converted_model_deep_copies_and_reverts() -> None:
    model = convert_batchnorm(nn.Sequential(nn.BatchNorm3d(C)))
    clone = copy.deepcopy(model)
    assert clone[0].weight is not model[0].weight
    revert_batchnorm(clone)
    assert type(clone[0]) is nn.BatchNorm3d and clone[0].weight is not model[0].weight
    assert torch.equal(clone[0].weight, model[0].weight)


def test_convert_sees_tensors_replaced_after_conversion() -> None:
    model = convert_batchnorm(nn.Sequential(nn.BatchNorm3d(C)))
    model.to(torch.float64)  # replaces buffers with new tensors
    revert_batchnorm(model)
    assert model[0].running_mean.dtype == torch.float64


def test_convert_root_batchnorm_returns_replacement() -> None:
    bn = nn.BatchNorm3d(C).eval()
    converted = convert_batchnorm(bn)
    assert isinstance(converted, MultigridBatchNorm) and not converted.training
    assert converted.weight is bn.weight
    assert revert_batchnorm(converted) is bn
    plain = revert_batchnorm(MultigridBatchNorm(C))
    assert type(plain).__name__ == "_BatchNormXd" and plain(torch.randn(4, C, 2, 2)).shape == (4, C, 2, 2)


def test_convert_exclude_and_other_norms() -> None:
    model = nn.Sequential()
    model.add_module("stem", nn.Sequential(nn.BatchNorm3d(C)))
    model.add_module("head", nn.Sequential(nn.BatchNorm1d(C), nn.LayerNorm(C)))
    model.add_module("group", nn.GroupNorm(1, C))
    model.add_module("instance", nn.InstanceNorm3d(C, affine=True, track_running_stats=True))
    model.add_module("sync", nn.SyncBatchNorm(C))
    convert_batchnorm(model, exclude=["head"])
    assert isinstance(model.stem[0], MultigridBatchNorm)
    assert type(model.head[0]) is nn.BatchNorm1d and type(model.head[1]) is nn.LayerNorm
    assert type(model.group) is nn.GroupNorm and type(model.instance) is nn.InstanceNorm3d
    assert isinstance(model.sync, MultigridBatchNorm)
    revert_batchnorm(model)
    assert type(model.sync) is nn.SyncBatchNorm and type(model.stem[0]) is nn.BatchNorm3d

    convert_batchnorm(model, exclude="stem.0")
    assert type(model.stem[0]) is nn.BatchNorm3d and isinstance(model.head[0], MultigridBatchNorm)
    with pytest.raises(ValueError, match=r"not in the model: \['stem.1'\]"):
        convert_batchnorm(model, exclude=["stem.1"])


def test_convert_warns_on_custom_forward_and_refuses_lazy() -> None:
    class Custom(nn.BatchNorm2d):
        def forward(self, input: torch.Tensor) -> torch.Tensor:
            return super().forward(input) * 2

    model = nn.Sequential(Custom(C))
    with pytest.warns(UserWarning, match=r"`0` \(Custom\) has its own forward"):
        convert_batchnorm(model)
    assert type(model[0]) is Custom
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        convert_batchnorm(model, exclude=["0"])
    with pytest.raises(ValueError, match="lazy BatchNorm"):
        convert_batchnorm(nn.Sequential(nn.LazyBatchNorm3d()))


def _video_models() -> list[tuple[str, nn.Module, object]]:
    from pytorchvideo.models.slowfast import create_slowfast
    from pytorchvideo.models.x3d import create_x3d
    from torchvision.models.video import r3d_18

    torch.manual_seed(0)
    x3d = create_x3d(
        input_clip_length=4, input_crop_size=64, depth_factor=1.0, width_factor=1.0,
        model_num_class=5, head_dim_out=32, dropout_rate=0.0,
    )
    slowfast = create_slowfast(
        model_depth=18, model_num_class=5, stem_dim_outs=(16, 2),
        head_pool_kernel_sizes=((2, 2, 2), (8, 2, 2)), dropout_rate=0.0,
    )
    r3d = r3d_18(weights=None, num_classes=5)
    return [
        ("x3d", x3d, torch.randn(2, 3, 4, 64, 64)),
        # A tuple: pytorchvideo's multipathway blocks write into a list input.
        ("slowfast", slowfast, (torch.randn(2, 3, 2, 64, 64), torch.randn(2, 3, 8, 64, 64))),
        ("r3d_18", r3d, torch.randn(1, 3, 4, 32, 32)),
    ]


def _fresh(x: object) -> object:
    return list(x) if isinstance(x, tuple) else x


@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")
def test_video_models_checkpoints_load_both_ways() -> None:
    for name, model, x in _video_models():
        # Non-trivial running statistics, so a mismatch in eval would show.
        for layer in model.modules():
            if isinstance(layer, _BatchNorm):
                layer.running_mean.uniform_(-0.1, 0.1)
                layer.running_var.uniform_(0.5, 1.5)
        model.eval()
        with torch.no_grad():
            expected = model(_fresh(x))
        plain_state = {k: v.clone() for k, v in model.state_dict().items()}
        num_bn = sum(isinstance(m, _BatchNorm) for m in model.modules())

        convert_batchnorm(model)
        assert sum(isinstance(m, MultigridBatchNorm) for m in model.modules()) == num_bn > 0, name
        assert apply_bn_plan(model, BNPlan("split", num_splits=2)) == num_bn
        converted_state = model.state_dict()
        assert {k: v.shape for k, v in converted_state.items()} == {k: v.shape for k, v in plain_state.items()}
        with torch.no_grad():
            assert torch.equal(model(_fresh(x)), expected), name
        model.load_state_dict(plain_state)  # an unconverted checkpoint into the converted model

        revert_batchnorm(model)
        assert not any(isinstance(m, MultigridBatchNorm) for m in model.modules())
        model.load_state_dict(converted_state)  # and a converted one back
        with torch.no_grad():
            assert torch.equal(model(_fresh(x)), expected), name


@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")
def test_converted_x3d_trains_in_split_mode() -> None:
    _, model, x = _video_models()[0]
    convert_batchnorm(model).train()
    apply_bn_plan(model, BNPlan("split", num_splits=2))
    model(torch.randn(5, 3, 4, 64, 64)).sum().backward()  # 5 clips in 2 groups (3 + 2)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad)
