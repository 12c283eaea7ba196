@@act@@
@group(0) @binding(1) var<storage, read> G: array<f32>;
@group(0) @binding(2) var<storage, read> V: array<f32>;
@group(0) @binding(3) var<storage, read_write> O: array<f32>;
@@each_element@@  O[off(2u) + i] = act(U.op, G[off(0u) + i]) * V[off(1u) + i];
}
