// hal::top_k_before's order, for the shaders that pick the k best (top_k.comp, moe_router.comp):
// true when value a at index ia comes before b at ib: larger first, the lower index among equals,
// NaN after every number (and equal to NaN).
bool before(float a, uint ia, float b, uint ib) {
  const bool an = isnan(a), bn = isnan(b);
  if (an != bn) return bn;
  if (an || a == b) return ia < ib;
  return a > b;
}
