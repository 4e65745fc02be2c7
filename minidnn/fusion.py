"""Fusing a ReLU with the layer next to it, where the bits stay the same: a convolution's bias
added in the ReLU's pass; the ReLU applied, and its gradient masked, by the batch norm or the
residual add before it; its gradient masked by the max pool after it. Each saves passes over
a map; `--no-fuse` (StepSpec.fuse) turns all of them off.

A convolution with a bias writes conv(x, w), then adds the bias in a second pass over its
output; the ReLU after it reads that output once more. When the ReLU is the output's only
reader and overwrites it in place, the bias add can move into the ReLU's own pass,
y = max(conv(x, w) + b, 0): the same float additions in the same order, so the same bits
(on the H200, VGG-16 b256 TF32 spent 6.5 ms of a 132 ms step in the separate bias adds).

What may move: the convolution's output is read by that ReLU alone (not the network's output,
no second reader) and the ReLU runs in place on it (memory/plan.LivenessPlan.inplace), so no
one ever sees the map without its bias; recomputing the ReLU recomputes the convolution first,
with the same deferral. Under bf16 maps the convolution's output is rounded to bf16 and the
ReLU adds the bias to it and rounds again: what the GPU's bf16 convolution with its own bias
add computes too (layers/precision.py), and on the CPU the same two roundings (a widened bf16
convolution rounds before adding its bias: layers/conv.py).

In backward, that ReLU also computes the bias's gradient, the sum of its input gradient
over all but the channel axis: on channels-last maps in the same pass, in the order of the
bias-gradient kernel, so again the same bits.

The decision is MemoryDecision.bias_relu ({ReLU node name: convolution node name}); the
executor hands the layers their parts of it through StepContext (bias_deferred, relu_bias).

On float32 maps the pair folds further: the convolution applies the bias and the ReLU
itself, y = max(conv(x, w) + b, 0), and the ReLU's forward has nothing left to do. On the
GPU that is one cuDNN graph with the bias and the ReLU in the convolution's epilogue
(kernels/cudnn_conv.py, fprop_bias_relu), so the map is written once instead of written,
read and written again (VGG-16 b256 TF32: 13 passes over 3.5 G values). The arithmetic is
the ReLU pass's: the float32 sum, plus the bias, then max; but cuDNN runs the fused graph
with engines of its own, whose sums may be taken in another order than the unfused
convolution's plan, so on the GPU the fused step agrees with `--no-fuse` within TF32
tolerance, not bit for bit (on the CPU it is the same code, the same bits); and not
under --deterministic, whose bits are the same whatever the plan (which ReLUs keep bit
masks among it). The backward
is the pair's above: the ReLU masks the gradient and sums the bias's. Only where the ReLU
keeps its output (its bit mask is written by its own pass) and not on bf16 maps, where the
H200 offers the fused graph only from engines compiled at run time, slower than the
convolution and the pass together (benchmarks/runs/wave15/probe_fusion.py). The decision
is MemoryDecision.conv_relu ({ReLU node name: convolution node name}, a part of bias_relu);
StepContext.relu_in_conv names those convolutions and StepContext.relu_forward_done those
ReLUs.

A ReLU after a batch norm moves the other way: the batch norm's affine pass applies it as it
writes its output, and the ReLU's forward has nothing left to do (one pass over the map
instead of two; ResNet-50 has 33 such pairs). The same conditions: the ReLU is the batch
norm's only reader, runs in place on its output and keeps its output (not bits) for
backward. Under bf16 maps too: the batch norm computes v in float32 and stores
narrow(max(v, 0)), the two layers narrow(v) and then max of that; rounding to nearest keeps
the sign and the order, so the two agree bit for bit (a negative v, even one that rounds to
-0, gives +0 both ways; a tiny positive v that rounds to +0 gives +0 both ways).

In backward the pair folds too: the ReLU's backward does nothing, and the batch norm's
applies the ReLU's mask to the gradient it reads, in its reduction pass and in its per-value
pass, with no pass of its own. That gradient is the ReLU's output gradient: the ReLU's input
gradient takes the same buffer (memory/plan.LivenessPlan.grad_alias), a further condition.
The mask is where the ReLU's output, recomputed from x with the forward's own operations
(the product rounded, then the sum: kernels/cpu_batchnorm.py, cuda_batchnorm.py) and stored
in the maps' dtype, is > 0: the ReLU's own mask, bit for bit; the masked values are the
ReLU backward's (a product on the CPU, a selection on the GPU), so again the same bits. The
liveness plan is the unfused one: the ReLU still keeps its output, which the convolution
after it keeps in ResNets anyway.

The decision is MemoryDecision.bn_relu ({ReLU node name: batch norm node name});
StepContext.relu_in_bn names the batch norms that apply the ReLU and StepContext.relu_done
the ReLUs whose forward and backward they do.

A ReLU after a residual add (two inputs) folds into the add the same way: the add writes
y = max(x0 + x1, 0) in its one pass, and the ReLU's forward does nothing (ResNet-50 has 16
such pairs). Under bf16 maps the add's sum v is float32 and stored narrow(max(v, 0)), which
is max(narrow(v), 0), as above. In backward the ReLU does nothing and the add masks its
output gradient where y > 0, y the add's output, which the ReLU overwrote in place with its
own: the ReLU's mask, bit for bit. One pass reads gy and y and writes the masked gradient to
both inputs' gradients: in place into gy's buffer, which input 0's gradient shares (the
liveness plan's grad_alias of the add, and of the ReLU, whose input gradient is that same
buffer), and into input 1's own buffer, which the unfused add fills with a copy. The same
conditions as above (the ReLU alone reads the add's output, in place, keeping its output),
and input 0's gradient is wanted (an add of the network's input has no buffer to mask in
place: it stays unfused); the add then retains its output for backward: the liveness plan
(memory/plan.py, `fuse`) counts that read, so offloading and recomputing keep y until the
add's backward (the ReLU's own retention ends one backward call earlier, at the ReLU's).

The decision is MemoryDecision.add_relu ({ReLU node name: add node name});
StepContext.relu_in_add names the adds that apply the ReLU, and StepContext.relu_done those
ReLUs too.

Such an add whose input 0 a batch norm writes (a ResNet block's last batch norm, bn3 -> add
-> relu) folds once more: the batch norm's affine pass reads the add's other input too and
writes y = max(s + z, 0), s its own affine value as stored (rounded to the maps' dtype), z
the other input: the add's sum and the ReLU's selection on it, add_relu's bits. The add's
forward then does nothing: y is already in its output, which is the batch norm's (the add
runs in place on input 0). The map is written once instead of written, read and written
again (ResNet-50 b256: 12 of its 16 adds, 3.8 G values in float32). Backward is unchanged:
the add masks its gradient with y, and the batch norm's backward reads x and its output
gradient, not its output. The conditions: the add_relu pair's, the batch norm's output read
by the add alone, and the other input written before the batch norm runs (a ResNet's
identity; a first block's projection comes after it, so that block stays unfused). Then the
other input is on the device when the batch norm runs: its last forward reader is the add,
which comes later; a recomputation of the add's output runs the batch norm again, after the
memory manager has brought back every input of the writers it reruns, the add's included.
The batch norm's forward call reads it as a second input (the memory manager's
`extra_inputs`). The decision is MemoryDecision.bn_add ({add node name: batch norm node
name}); StepContext.add_in_bn names those batch norms and StepContext.add_done those adds.

A ReLU before a max pool hands its backward to the pool. Unfused, the pool's backward writes
its input gradient (each window's gradient at its winner) and the ReLU's reads it and the
ReLU's output, and writes it again masked: four passes over the largest maps of VGG-16, whose
every pool follows a ReLU. Where the window's winner lies, the ReLU's output is the window's
maximum, which the pool's forward has in hand: it marks the windows whose maximum is > 0 in
a spare bit of their argmax (kernels: RELU_MASK_BIT), and its backward routes a window's
gradient only where that bit is set. The values are the ReLU backward's: the selection on
the GPU (a value no window routes to is +0 both ways), the product on the CPU, whose pool
routes the marks as it routes the gradient and multiplies (kernels/cpu.py). The ReLU's
backward has nothing left to mask: its input gradient is its output gradient's buffer
(grad_alias), which the pool wrote; if it added a convolution's bias, it still sums that
bias's gradient over the masked values, the bias-gradient kernel's sums in its order, so the
same bits. Its forward is unchanged, but it keeps nothing for backward, neither its output
nor bits: the map is free after the pool's forward (memory/plan.LivenessPlan.pooled_relus,
where the conditions are written: the ReLU's output is read by that pool alone, whose
windows leave the argmax its spare bit, neither is a piece of a layer chunk, and the ReLU's
input gradient shares its output gradient's buffer). A ReLU asked to keep bits keeps
nothing either. The decision is MemoryDecision.pool_relu ({ReLU node name: max pool node
name}); StepContext.relu_in_pool names those pools and StepContext.relu_mask_done those
ReLUs.

Such a pool may apply the ReLU's forward too, where no layer before it does (on bf16 maps,
where the convolution leaves its bias to the ReLU's pass; without a bias; under
--deterministic). Unfused, the ReLU reads the convolution's output and writes its own in
place, and the pool reads that: three passes over the map, of which the pool's read alone
is needed. The ReLU runs in place, so the pool's input buffer holds the ReLU's input when
the ReLU's forward does nothing; the pool reads it and computes, for each value of a
window as it reads it, what the ReLU would have stored: max(x + b, 0) rounded once to the
maps' dtype (kernels: relu_before in cuda_pool.py; on the CPU the ReLU's own kernel on a
copy), then its comparisons on those values as before. So the same maxima, the same
winners and marks, the same bits, and one pass over each of VGG-16's five largest maps
where there were three. Nothing reads the map after the pool (the ReLU keeps nothing, the
pool only its argmax), so the map may hold the ReLU's input instead of its output. The
conditions: the pool_relu pair, the ReLU in place, its forward not done by its convolution
(conv_relu), batch norm or add (bn_relu, add_relu). The decision is
MemoryDecision.pool_relu_forward ({ReLU node name: max pool node name}, a part of
pool_relu); StepContext.relu_before_pool ({max pool node name: ReLU node name}) names the
pools, and those ReLUs join StepContext.relu_forward_done.

Such a ReLU that added its convolution's bias still sums the bias's gradient in backward,
reading the map the pool's backward has just written: the pool can take those sums as it
writes it. On the GPU (channels-last float32 and bf16 maps) one kernel writes the pool's
input gradient, each value gathered as the pool's own kernels gather it, over the threads
as the bias-gradient kernel lays a map out, and adds up what it writes in that kernel's
order (kernels/cuda_pool.py, maxpool2d_backward_sums): the same values and the same sums,
so the same bits, one read of the map fewer (VGG-16 b256: the five maps its pools read, 1.57 G
values, 6.3 GB a step in float32); elsewhere the pool's kernel, then the bias gradient's.
The ReLU's backward then has nothing left to do. The conditions: the pool_relu pair, the
ReLU adds its convolution's bias (bias_relu), and not under --deterministic, whose bias
gradients are summed slice by slice. The decision is MemoryDecision.pool_bias ({ReLU node
name: max pool node name}, a part of pool_relu); StepContext.pool_bias ({max pool node name:
the bias Parameter}) names the pools, StepContext.bias_in_pool those ReLUs. The partial sums
live in the pool's call, where the step model counts them. On the H200 the fused pass took
3.21 ms of VGG-16 b256's float32 pools where the two passes took 4.21; on bf16 maps it
saves nothing (2.62 against 2.58 ms: benchmarks/RESULTS.md, twenty-sixth wave).

Such an add's backward may also take over a sum of gradients. A ResNet block's output y (the
ReLU's, after the add) is read by the next block twice: by its identity path (the next add,
or a projection convolution) and by its first convolution, which comes right after the
ReLU. In backward the first convolution's is the later of the two: it writes its gradient
of y into a temporary, and the memory manager adds that into the gradient the identity
path wrote (one pass reading both and writing the sum); two calls later the add reads the
sum and y and writes its masked gradient to both inputs. The add can read the two parts
instead and write the masked sum: the sum stored as the memory manager's add stores it
(rounded once to the maps' dtype), then masked, so the same bits, and one pass where there
were two (ResNet-50: 15 of its 16 blocks). The temporary lives two calls longer, until the
add's backward, which the dry run that plans the step sees. The conditions: the add_relu
pair, y read by exactly two layers, the earlier of which runs right after the ReLU, which
runs right after the add (so nothing else reads the gradient between), and neither a piece
of a layer chunk. Which adds is the plan's rule, as for the pools: it changes what the step
holds, so the assembly takes the pairs from the plan (a dry run of the step, whose decision
names no fusion, then holds what the run holds), and MemoryDecision.add_sum ({add node name:
the node whose gradient of y it adds}), filled in by decide.py, names the same. The memory
manager keeps that node's temporary for the add (`deferred_sums`), apart from the calls'
short-lived blocks, and the executor hands it to the add's backward as
StepContext.gy_addend. Where the add's backward widens bf16 maps (on the CPU) the memory
manager keeps the sum (Assembly._add_sum).

Such an add's backward writes the same masked gradient to both its inputs' gradients, and
the batch norm whose backward comes right after it (a block's last batch norm, bn3, or a
projection's, which runs after bn3) reads the one copy it was written for once, then writes
its own gradient over it in place. The batch norm can read the other input's copy instead,
and write its gradient into the buffer it would have read: the add then writes one copy,
one map fewer of the five (with a sum) or four its pass moves (ResNet-50 b256: all 16 of
its adds, 1.41 G values a step, a write of 5.7 GB less in float32; the other copy stays
unwritten until the batch norm's gradient fills it). The values are the add's, read from another
buffer, so the same bits. The conditions: the add_relu pair; the batch norm writes one of
the add's two inputs, which the add alone reads, and its backward is the next call after the
add's (nothing may write the other copy in between: a recomputation writes maps, not
gradients); the add's other input's gradient is wanted; neither is a piece of a layer
chunk; and the add's backward does not widen bf16 maps (on the CPU), where the widened
copies are written back whole. The decision is MemoryDecision.bn_grad ({batch norm node
name: add node name}); StepContext.add_grad_to ({add node name: the input whose gradient it
writes}) names those adds, and the executor hands the batch norm that gradient as its gy
(Executor._handed_gradient).

That batch norm's backward then reads the gradient twice: its first pass adds, per channel,
the gradient and its product with x - mean (two maps read), its second writes its own
gradient. The add's pass can take those sums as it writes the gradient, reading x as well:
one map fewer read (ResNet-50 b256: 16 batch norms, 1.41 G values a step, 5.7 GB less in
float32). On the GPU the sums kernels have a mode for it (kernels/cuda_batchnorm.py,
handed_sums): a block reads the add's output, its gradient and the sum's other part where
the plain pass read the gradient, and makes and writes the masked gradient as the add's
kernel makes it; its blocks, their rows and the order of every sum are the plain pass's, so
the same bits; on the CPU the add's kernel, then the batch norm's sums of its output. The
batch norm's backward starts from the sums (layers/batchnorm.GradientSums). The conditions:
the bn_grad pair; the batch norm's input is on the device at the add's backward, the call
before its own, which a step that neither offloads nor recomputes it keeps there (the
decision's offload and recompute, so the plan is unchanged); not where each slice of
--deterministic has statistics of its own (with split statistics), whose sums run slice by
slice; not under --sync-batchnorm, whose sums are the global batch's (the batch norm then
hands nothing: the add writes the gradient alone). The stage-one sums, at most 2 MiB, live
one call longer, from the add's call to the batch norm's, which the step model counts in the
add's call (planner/costs.handed_sums_bytes). The decision is MemoryDecision.bn_sums ({batch
norm node name: add node name}, a part of bn_grad); StepContext.gradient_sums carries the
sums from the add's call to the batch norm's. On the H200 the fused pass saves 1.09 ms of a
ResNet-50 b256 float32 step's 8.73 ms of those passes, 0.13 ms in bf16, where it runs below
the two plain passes' memory speed (benchmarks/RESULTS.md, twenty-fifth wave).
"""
from __future__ import annotations

from .layers import precision as mixed
from .memory.plan import LivenessPlan


def widens_backward(plan: LivenessPlan, i: int, bf16_ops) -> bool:
    """Whether node i's backward, in a step planned as `plan`, widens bf16 maps to float32
    copies on a device whose kernels take the ops `bf16_ops` on bf16 maps as they are
    (layers/precision.py; the CPU's take none). A fused pass that writes, or sums, what
    another call reads is left unfused in such a call: the widened copies are written back
    whole, rounded, after it."""
    return bool(mixed.temporary_bytes(plan.nodes[i].layer, bf16_ops,
                                      plan.call_maps(i, "backward"), "backward"))


def _relu_after(plan: LivenessPlan, kind: str):
    """(ReLU node, the node it reads) for every ReLU that reads, alone and in place, the
    output of a layer of `kind` (not the network's output), in a step planned as `plan`.
    Pieces of a layer chunk (minidnn/chunks.py) are left out: the pairs are named by node,
    and the layers they share look them up by their own name."""
    net = plan.net
    readers = net.consumers()
    producers = {n.name: n for n in plan.nodes}
    for i, node in enumerate(plan.nodes):
        if node.layer.kind != "relu" or len(node.inputs) != 1 or not plan.inplace.get(i) \
                or node.piece is not None:
            continue
        src = node.inputs[0]
        producer = producers.get(src)          # None: the network's input
        if producer is None or src == net.output or producer.layer.kind != kind:
            continue
        if [n.name for n in readers[src]] == [node.name]:
            yield node, producer


def bias_relu_pairs(plan: LivenessPlan) -> dict:
    """{ReLU node name: convolution node name} of every ReLU that may add the bias of the
    convolution it reads (the conditions above), for a step planned as `plan`."""
    return {relu.name: conv.name for relu, conv in _relu_after(plan, "conv")
            if conv.layer.bias}


def _writes_no_bits(plan: LivenessPlan, i: int) -> bool:
    """Whether ReLU node i's forward writes no bit mask: it keeps its output, or its max
    pool applies its mask and it keeps nothing (pool_relu)."""
    return i in plan.pooled_relus or plan.nodes[i].layer.keep_in(plan.relu_bits) == "output"


def conv_relu_pairs(plan: LivenessPlan, deterministic: bool) -> dict:
    """{ReLU node name: convolution node name} of the bias_relu pairs whose convolution may
    apply the bias and the ReLU in its own forward (the conditions above: float32 maps, the
    ReLU writes no bits, not deterministic), for a step planned as `plan`."""
    if plan.maps.precision != "fp32" or deterministic:
        return {}
    index = {node.name: i for i, node in enumerate(plan.nodes)}
    return {relu: conv for relu, conv in bias_relu_pairs(plan).items()
            if _writes_no_bits(plan, index[relu])}


def bn_relu_pairs(plan: LivenessPlan) -> dict:
    """{ReLU node name: batch norm node name} of every ReLU that the batch norm it reads may
    apply in its own passes, forward and backward (the conditions above), for a step planned
    as `plan`."""
    index = {node.name: i for i, node in enumerate(plan.nodes)}
    return {relu.name: bn.name for relu, bn in _relu_after(plan, "batchnorm")
            if _writes_no_bits(plan, index[relu.name]) and plan.grad_alias.get(index[relu.name])}


def pool_relu_pairs(plan: LivenessPlan) -> dict:
    """{ReLU node name: max pool node name} of every ReLU whose mask the max pool after it
    applies in its backward (the conditions above), for a step planned as `plan` (one planned
    with `fuse`). Which ReLUs is the plan's rule (LivenessPlan.pooled_relus), written once:
    such a ReLU keeps nothing for backward."""
    return {plan.nodes[r].name: plan.nodes[p].name for r, p in plan.pooled_relus.items()}


def pool_relu_forward_pairs(plan: LivenessPlan, deterministic: bool) -> dict:
    """{ReLU node name: max pool node name} of the pool_relu pairs whose pool may apply the
    ReLU's forward too (the conditions above), for a step planned as `plan` (one planned
    with `fuse`); `deterministic`: the step's (conv_relu is off then, so these pools apply
    the ReLUs their convolutions would have)."""
    index = {node.name: i for i, node in enumerate(plan.nodes)}
    done_before = {**conv_relu_pairs(plan, deterministic), **bn_relu_pairs(plan),
                   **add_relu_pairs(plan)}
    return {relu: pool for relu, pool in pool_relu_pairs(plan).items()
            if plan.inplace.get(index[relu]) and relu not in done_before}


def pool_bias_pairs(plan: LivenessPlan, deterministic: bool) -> dict:
    """The pool_relu pairs whose pool sums the gradient of the bias its ReLU added (the
    conditions above).

    Args:
        plan: the step's LivenessPlan (one planned with `fuse`).
        deterministic: the step's (its bias gradients are summed slice by slice: then none).
    Returns:
        {ReLU node name: max pool node name}, a part of pool_relu_pairs(plan).
    """
    if deterministic:
        return {}
    biased = bias_relu_pairs(plan)
    return {relu: pool for relu, pool in pool_relu_pairs(plan).items() if relu in biased}


def add_relu_pairs(plan: LivenessPlan) -> dict:
    """{ReLU node name: add node name} of every ReLU that the two-input add it reads may
    apply in its own passes, forward and backward (the conditions above), for a step planned
    as `plan` (one planned with `fuse`, whose adds retain their output for the mask).
    Which adds may is the plan's rule (LivenessPlan._adds_before_relus), written once: an
    add retains its output only then."""
    index = {node.name: i for i, node in enumerate(plan.nodes)}
    return {relu.name: add.name for relu, add in _relu_after(plan, "add")
            if plan.retains_output(index[add.name]) and plan.grad_alias.get(index[relu.name])}


def bn_add_pairs(plan: LivenessPlan) -> dict:
    """{add node name: batch norm node name} of every add_relu add whose forward, and the
    ReLU's, the batch norm writing its input 0 may do in its affine pass (the conditions
    above), for a step planned as `plan` (one planned with `fuse`). Which batch norms may is
    the plan's rule (LivenessPlan._bn_adds, which asks the add_relu conditions too), written
    once: their forward calls read the add's other input, which the plan counts."""
    readers = plan.net.consumers()
    names = [plan.nodes[b].name for b in plan.residual_reads]
    return {readers[bn][0].name: bn for bn in names}


def add_sum_pairs(plan: LivenessPlan) -> dict:
    """The adds that take over the sum of their ReLU output's two gradient parts (the
    conditions above) in a step planned as `plan`: adds of add_relu_pairs (none in a plan
    made without `fuse`).

    Args:
        plan: the step's LivenessPlan.
    Returns:
        {add node name: the node (the ReLU output's earlier reader) whose gradient part the
        add sums}.
    """
    readers = plan.net.consumers()
    index = {node.name: i for i, node in enumerate(plan.nodes)}
    pairs = {}
    for relu, add in add_relu_pairs(plan).items():
        r = index[relu]
        both = readers[relu]
        if index[add] != r - 1 or len(both) != 2 or relu == plan.net.output:
            continue
        first, other = sorted(both, key=lambda n: index[n.name])
        if first.name == other.name or index[first.name] != r + 1:
            continue
        if first.piece is not None or other.piece is not None:   # rows of a layer chunk
            continue
        if all(plan.grad_wanted(n, k) for n in both for k, inp in enumerate(n.inputs)
               if inp == relu):
            pairs[add] = first.name
    return pairs


def bn_sums_pairs(plan: LivenessPlan, moved, sliced_statistics: bool) -> dict:
    """The bn_grad batch norms whose sums the add takes in its pass (the conditions above)
    in a step planned as `plan`.

    Args:
        plan: the step's LivenessPlan.
        moved: the storage ids the step offloads or recomputes (the decision's).
        sliced_statistics: batch norms normalize each slice on its own (--deterministic
            with split statistics: then none).
    Returns:
        {batch norm node name: add node name}, a part of bn_grad_pairs(plan).
    """
    if sliced_statistics:
        return {}
    return {bn: add for bn, add in bn_grad_pairs(plan).items()
            if plan.tensors[plan.net.node(bn).inputs[0]].storage not in moved}


def bn_grad_pairs(plan: LivenessPlan) -> dict:
    """The batch norms that read their output gradient from the gradient of the add's other
    input (the conditions above) in a step planned as `plan`: of adds of add_relu_pairs.

    Args:
        plan: the step's LivenessPlan.
    Returns:
        {batch norm node name: add node name}, the batch norm's backward the next call after
        the add's.
    """
    readers = plan.net.consumers()
    index = {node.name: i for i, node in enumerate(plan.nodes)}
    pairs = {}
    for add in add_relu_pairs(plan).values():
        a = index[add]
        node, bn = plan.nodes[a], plan.nodes[a - 1]
        if bn.layer.kind != "batchnorm" or len(node.inputs) != 2 or bn.name not in node.inputs \
                or node.inputs[0] == node.inputs[1]:
            continue
        other = 1 - node.inputs.index(bn.name)
        if [n.name for n in readers[bn.name]] != [add] or bn.name == plan.net.output:
            continue
        if node.piece is not None or bn.piece is not None or not plan.grad_wanted(node, other):
            continue
        pairs[bn.name] = add
    return pairs
