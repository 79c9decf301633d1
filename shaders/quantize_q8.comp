// x [rows][k] F32 -> the int8 activations of the Q8_0 matmul (matmul.comp): per block of 32, d =
// max|x| / 127 and q = roundEven(x * (1 / d)) in [-127, 127] (q = 0 where d == 0), four q per
// word, low byte first. The CPU backend quantises x the same way (backends/cpu/kernels/
// quantize_x.cpp), so a Q8_0 matmul (matmul.comp) gives the CPU's results within the F32 rounding
// of its accumulation (tests/ops: Q8_0MatmulQuantisesActivationsAsTheCpuDoes; a GPU whose division
// is not correctly rounded may also move an activation by one step now and then). One invocation
// per block.
#version 450
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer Q { uint q[]; };
layout(std430, binding = 2) writeonly buffer D { float d[]; };
layout(push_constant) uniform Params {
  uint x_off, q_off, d_off;
  uint blocks;
  uint gx;
} p;

// a / b rounded to nearest, as the CPU's division is: Vulkan lets a division be off by 2.5 ulp
// (lavapipe, for one, multiplies by an approximate reciprocal), and one ulp of d moves the
// rounding of any x that lands near a half-step. Refines the reciprocal and then the quotient by
// their fused residuals (Markstein): exact for the normal a and b here.
float div_rn(float a, float b) {
  precise float r = 1.0 / b;
  precise float er = fma(-b, r, 1.0);
  r = fma(er, r, r);
  precise float q = a * r;
  precise float e = fma(-q, b, a);
  return fma(e, r, q);
}

void main() {
  const uint b = (gl_WorkGroupID.x + gl_WorkGroupID.y * p.gx) * 64 + gl_LocalInvocationID.x;
  if (b >= p.blocks) return;
  const uint at = p.x_off + b * 32;
  float amax = 0.0;
  for (uint j = 0; j < 32; ++j) amax = max(amax, abs(x[at + j]));
  const float dd = div_rn(amax, 127.0);
  const float id = dd != 0.0 ? div_rn(1.0, dd) : 0.0;
  d[p.d_off + b] = dd;
  for (uint w = 0; w < 8; ++w) {
    uint packed = 0;
    for (uint i = 0; i < 4; ++i) {
      const int v = int(roundEven(x[at + 4 * w + i] * id));
      packed |= (uint(v) & 0xffu) << (8 * i);
    }
    q[p.q_off + b * 8 + w] = packed;
  }
}
