"""Kompute's documented behaviour, in numbers, through `import kbench.runtime as kp`."""
from __future__ import annotations

import numpy as np
import pytest

import kbench.runtime as kp

README_SHADER = """
#version 450
layout (local_size_x = 1) in;
layout(set = 0, binding = 0) buffer buf_in_a { float in_a[]; };
layout(set = 0, binding = 1) buffer buf_in_b { float in_b[]; };
layout(set = 0, binding = 2) buffer buf_out_a { uint out_a[]; };
layout(set = 0, binding = 3) buffer buf_out_b { uint out_b[]; };
layout(push_constant) uniform PushConstants { float val; } push_const;
layout(constant_id = 0) const float const_one = 0;
void main() {
    uint index = gl_GlobalInvocationID.x;
    out_a[index] += uint( in_a[index] * in_b[index] );
    out_b[index] += uint( const_one * push_const.val );
}
"""

PUSH_XYZ = """
#version 450
layout(local_size_x = 1) in;
layout(push_constant) uniform PushConstants { {T} x; {T} y; {T} z; } pcs;
layout(set = 0, binding = 0) buffer a { {T} pa[]; };
void main() { pa[0] += pcs.x; pa[1] += pcs.y; pa[2] += pcs.z; }
"""


def test_readme_example_gives_4_8_12_and_10_10_10(mgr, compile_glsl):
    a = mgr.tensor_t(np.array([2, 2, 2], dtype=np.float32))
    b = mgr.tensor_t(np.array([1, 2, 3], dtype=np.float32))
    out_a = mgr.tensor_t(np.array([0, 0, 0], dtype=np.uint32))
    out_b = mgr.tensor_t(np.array([0, 0, 0], dtype=np.uint32))
    params = [a, b, out_a, out_b]
    algo = mgr.algorithm(params, compile_glsl(README_SHADER), (3, 1, 1), [2], [2])
    (mgr.sequence().record(kp.OpTensorSyncDevice(params)).record(kp.OpAlgoDispatch(algo))
     .record(kp.OpAlgoDispatch(algo, [3])).eval())
    sq = mgr.sequence()
    sq.eval_async(kp.OpTensorSyncLocal(params))
    assert sq.eval_await()
    assert out_a.data().tolist() == [4, 8, 12]
    assert out_b.data().tolist() == [10, 10, 10]


def test_push_constants_override_accumulates_to_0_7_0_6_0_5(mgr, compile_glsl):
    t = mgr.tensor([0, 0, 0])
    algo = mgr.algorithm([t], compile_glsl(PUSH_XYZ.replace("{T}", "float")), (1, 1, 1), [], [0.1, 0.2, 0.3])
    (mgr.sequence().record(kp.OpTensorSyncDevice([t])).record(kp.OpAlgoDispatch(algo))
     .record(kp.OpAlgoDispatch(algo, [0.3, 0.2, 0.1])).record(kp.OpAlgoDispatch(algo, [0.3, 0.2, 0.1]))
     .record(kp.OpTensorSyncLocal([t])).eval())
    np.testing.assert_allclose(t.data(), [0.7, 0.6, 0.5], rtol=1e-6)


def test_int32_push_constants_are_not_read_as_float_bits(mgr, compile_glsl):
    t = mgr.tensor_t(np.zeros(3, dtype=np.int32))
    pc = np.array([-1, -1, -1], dtype=np.int32)
    algo = mgr.algorithm([t], compile_glsl(PUSH_XYZ.replace("{T}", "int")), (1, 1, 1), [], pc)
    seq = mgr.sequence().record(kp.OpTensorSyncDevice([t]))
    for _ in range(3):
        seq.record(kp.OpAlgoDispatch(algo, pc))
    seq.record(kp.OpTensorSyncLocal([t])).eval()
    assert t.data().tolist() == [-3, -3, -3]


TYPES = {"int": np.int32, "uint": np.uint32, "float": np.float32}


@pytest.mark.parametrize("push_t", sorted(TYPES))
@pytest.mark.parametrize("spec_t", sorted(TYPES))
def test_every_push_and_spec_dtype_pairing_adds_up(mgr, compile_glsl, push_t, spec_t):
    src = f"""
#version 450
layout(local_size_x = 1) in;
layout(constant_id = 0) const {spec_t} cOne = {spec_t}(0);
layout(push_constant) uniform P {{ {push_t} x; {push_t} y; {push_t} z; }} pcs;
layout(set = 0, binding = 0) buffer a {{ {push_t} pa[]; }};
void main() {{ pa[0] += pcs.x + {push_t}(cOne); pa[1] += pcs.y + {push_t}(cOne); pa[2] += pcs.z + {push_t}(cOne); }}
"""
    t = mgr.tensor_t(np.zeros(3, dtype=TYPES[push_t]))
    algo = mgr.algorithm([t], compile_glsl(src), (1, 1, 1), np.array([5], TYPES[spec_t]),
                         np.array([1, 2, 3], TYPES[push_t]))
    mgr.sequence().record(kp.OpTensorSyncDevice([t])).record(kp.OpAlgoDispatch(algo)).record(
        kp.OpTensorSyncLocal([t])).eval()
    assert t.data().tolist() == [6, 7, 8]


def test_workgroup_is_the_dispatch_grid_16_by_8(mgr, compile_glsl):
    src = """
#version 450
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) buffer a { float pa[]; };
layout(set = 0, binding = 1) buffer b { float pb[]; };
void main() {
    uint index = gl_WorkGroupID.x * gl_NumWorkGroups.y + gl_WorkGroupID.y;
    pa[index] = gl_WorkGroupID.x;
    pb[index] = gl_WorkGroupID.y;
}
"""
    a, b = mgr.tensor(np.zeros(16 * 8)), mgr.tensor(np.zeros(16 * 8))
    algo = mgr.algorithm([a, b], compile_glsl(src), (16, 8, 1))
    mgr.sequence().record(kp.OpTensorSyncDevice([a, b])).record(kp.OpAlgoDispatch(algo)).record(
        kp.OpTensorSyncLocal([a, b])).eval()
    assert a.data().tolist() == np.repeat(np.arange(16), 8).tolist()
    assert b.data().tolist() == np.tile(np.arange(8), 16).tolist()


MULT_SRC = """
#version 450
{EXT}
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) buffer A {{ {T} a[]; }};
layout(set = 0, binding = 1) buffer B {{ {T} b[]; }};
layout(set = 0, binding = 2) buffer O {{ {T} o[]; }};
void main() {{ uint i = gl_GlobalInvocationID.x; o[i] = a[i] * b[i]; }}
"""


@pytest.mark.parametrize("glsl_t,np_t", [("float", np.float32), ("int", np.int32), ("uint", np.uint32),
                                         ("double", np.float64)])
def test_exact_products_per_dtype(mgr, compile_glsl, glsl_t, np_t):
    if np_t == np.float64 and not mgr.get_device_properties()["features"]["float64"]:
        pytest.skip("device lacks shaderFloat64")
    a = mgr.tensor_t(np.array([123, 153, 231], dtype=np_t))
    b = mgr.tensor_t(np.array([9482, 1208, 1238], dtype=np_t))
    o = mgr.tensor_t(np.zeros(3, dtype=np_t))
    algo = mgr.algorithm([a, b, o], compile_glsl(MULT_SRC.format(EXT="", T=glsl_t)))
    mgr.sequence().record(kp.OpTensorSyncDevice([a, b])).record(kp.OpAlgoDispatch(algo)).record(
        kp.OpTensorSyncLocal([o])).eval()
    assert o.data().tolist() == [123 * 9482, 153 * 1208, 231 * 1238]


def test_uint_tensor_bound_to_float_shader_is_not_converted(mgr, compile_glsl):
    a = mgr.tensor_t(np.array([123, 153, 231], dtype=np.uint32))
    b = mgr.tensor_t(np.array([9482, 1208, 1238], dtype=np.uint32))
    o = mgr.tensor_t(np.zeros(3, dtype=np.uint32))
    algo = mgr.algorithm([a, b, o], compile_glsl(MULT_SRC.format(EXT="", T="float")))
    mgr.sequence().record(kp.OpTensorSyncDevice([a, b])).record(kp.OpAlgoDispatch(algo)).record(
        kp.OpTensorSyncLocal([o])).eval()
    assert o.data().tolist() != [123 * 9482, 153 * 1208, 231 * 1238]


def test_builtin_opmult_multiplies(mgr):
    a, b, o = mgr.tensor([2, 4, 6]), mgr.tensor([1, 2, 3]), mgr.tensor([0, 0, 0])
    mgr.sequence().record(kp.OpTensorSyncDevice([a, b])).record(kp.OpMult([a, b, o], mgr.algorithm())).record(
        kp.OpTensorSyncLocal([o])).eval()
    assert o.data().tolist() == [2, 8, 18]


LOGISTIC = """
#version 450
layout (constant_id = 0) const float m = 0;
layout (local_size_x = 1) in;
layout(set = 0, binding = 0) buffer bxi { float xi[]; };
layout(set = 0, binding = 1) buffer bxj { float xj[]; };
layout(set = 0, binding = 2) buffer by { float y[]; };
layout(set = 0, binding = 3) buffer bwin { float win[]; };
layout(set = 0, binding = 4) buffer bwouti { float wouti[]; };
layout(set = 0, binding = 5) buffer bwoutj { float woutj[]; };
layout(set = 0, binding = 6) buffer bbin { float bin[]; };
layout(set = 0, binding = 7) buffer bbout { float bout[]; };
layout(set = 0, binding = 8) buffer blout { float lout[]; };
float sigmoid(float z) { return 1.0 / (1.0 + exp(-z)); }
void main() {
    uint idx = gl_GlobalInvocationID.x;
    vec2 w = vec2(win[0], win[1]);
    vec2 x = vec2(xi[idx], xj[idx]);
    float yhat = sigmoid(dot(w, x) + bin[0]);
    float d = yhat - y[idx];
    wouti[idx] = d * x.x / m;
    woutj[idx] = d * x.y / m;
    bout[idx] = d / m;
    lout[idx] = -(y[idx] * log(yhat) + (1.0 - y[idx]) * log(1.0 - yhat)) / m;
}
"""


def test_logistic_regression_through_mutated_views_converges(mgr, compile_glsl):
    xi = mgr.tensor([0, 1, 1, 1, 1])
    xj = mgr.tensor([0, 0, 0, 1, 1])
    y = mgr.tensor([0, 0, 0, 1, 1])
    w_in = mgr.tensor([0.001, 0.001])
    wi, wj = mgr.tensor(np.zeros(5)), mgr.tensor(np.zeros(5))
    b_in, b_out, l_out = mgr.tensor([0]), mgr.tensor(np.zeros(5)), mgr.tensor(np.zeros(5))
    params = [xi, xj, y, w_in, wi, wj, b_in, b_out, l_out]
    mgr.sequence().eval(kp.OpTensorSyncDevice(params))
    algo = mgr.algorithm(params, compile_glsl(LOGISTIC), (5, 1, 1), [5.0])
    seq = (mgr.sequence().record(kp.OpTensorSyncDevice([w_in, b_in])).record(kp.OpAlgoDispatch(algo))
           .record(kp.OpTensorSyncLocal([wi, wj, b_out, l_out])))
    for _ in range(100):
        seq.eval()
        w_in.data()[0] -= 0.1 * wi.data().sum()
        w_in.data()[1] -= 0.1 * wj.data().sum()
        b_in.data()[0] -= 0.1 * b_out.data().sum()
    w = w_in.data()
    assert w[0] < 0.01 and w[1] > 1.0 and b_in.data()[0] < 0.0, (w.tolist(), b_in.data().tolist())


def test_rebuild_with_permuted_bindings_then_rerecord(mgr, compile_glsl):
    src = """
#version 450
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) buffer A { float a[]; };
layout(set = 0, binding = 1) buffer B { float b[]; };
void main() { uint i = gl_GlobalInvocationID.x; b[i] = a[i] * 2.0; }
"""
    x, y = mgr.tensor([1, 2, 3]), mgr.tensor([10, 20, 30])
    spv = compile_glsl(src)
    algo = mgr.algorithm([x, y], spv)
    seq = mgr.sequence().record(kp.OpTensorSyncDevice([x, y])).record(kp.OpAlgoDispatch(algo)).record(
        kp.OpTensorSyncLocal([x, y]))
    seq.eval()
    assert y.data().tolist() == [2, 4, 6]
    algo.rebuild([y, x], spv)
    seq.rerecord()
    seq.eval()
    assert x.data().tolist() == [4, 8, 12]


def test_record_once_eval_three_times_runs_three_times(mgr, compile_glsl):
    t = mgr.tensor([0, 0, 0])
    algo = mgr.algorithm([t], compile_glsl(PUSH_XYZ.replace("{T}", "float")), (1, 1, 1), [], [1, 1, 1])
    mgr.sequence().eval(kp.OpTensorSyncDevice([t]))
    seq = mgr.sequence().record(kp.OpAlgoDispatch(algo))
    for _ in range(3):
        seq.eval()
    mgr.sequence().eval(kp.OpTensorSyncLocal([t]))
    assert t.data().tolist() == [3, 3, 3]


def test_timestamps_are_ops_plus_one(mgr):
    a, b, o = mgr.tensor([1, 2]), mgr.tensor([3, 4]), mgr.tensor([0, 0])
    seq = mgr.sequence(total_timestamps=10)
    seq.record(kp.OpTensorSyncDevice([a, b])).record(kp.OpMult([a, b, o], mgr.algorithm())).record(
        kp.OpTensorSyncLocal([o])).eval()
    ts = seq.get_timestamps()
    assert len(ts) == 4, ts
    assert ts == sorted(ts), f"timestamps must not go backwards: {ts}"


def test_tensor_accessors(mgr):
    t = mgr.tensor_t(np.arange(5, dtype=np.int32), kp.TensorTypes.host)
    assert (t.size(), len(t), t.data_type(), t.tensor_type(), t.is_init()) == (
        5, 5, kp.DataTypes.int, kp.TensorTypes.host, True)
    t.destroy()
    assert not t.is_init()


def test_builtin_opmult_spreads_large_grids_over_y(mgr):
    limit = mgr.get_device_properties()["max_work_group_count"][0]
    n = min(limit * 64 + 1000, 1 << 26) if limit < (1 << 20) else 5_000_000
    a = mgr.tensor(np.random.rand(n).astype(np.float32))
    b = mgr.tensor(np.random.rand(n).astype(np.float32))
    o = mgr.tensor(np.zeros(n, np.float32))
    mgr.sequence().record(kp.OpTensorSyncDevice([a, b])).record(kp.OpMult([a, b, o], mgr.algorithm())).record(
        kp.OpTensorSyncLocal([o])).eval()
    np.testing.assert_array_equal(o.data(), a.data() * b.data())
