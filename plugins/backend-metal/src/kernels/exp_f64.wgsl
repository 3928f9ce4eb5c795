// e^x and tanh in f64, rounded once to f32: correctly rounded in all but the rarest cases,
// as libm's expf and tanhf (the CPU's) nearly always are.

// e^x for |x| ≤ 200: x = k·ln2 + r, a degree-13 Taylor polynomial of e^r (|r| ≤ ln2/2,
// relative error < 1e-17), times 2^k.
fn exp64(x: f64) -> f64 {
    let k = floor(x * 1.4426950408889634lf + 0.5lf);
    let r = (x - k * 0.693147180369123816490lf) - k * 1.90821492927058770002e-10lf;
    var p = 1.0lf / 6227020800.0lf;
    p = p * r + 1.0lf / 479001600.0lf;
    p = p * r + 1.0lf / 39916800.0lf;
    p = p * r + 1.0lf / 3628800.0lf;
    p = p * r + 1.0lf / 362880.0lf;
    p = p * r + 1.0lf / 40320.0lf;
    p = p * r + 1.0lf / 5040.0lf;
    p = p * r + 1.0lf / 720.0lf;
    p = p * r + 1.0lf / 120.0lf;
    p = p * r + 1.0lf / 24.0lf;
    p = p * r + 1.0lf / 6.0lf;
    p = p * r + 0.5lf;
    p = p * r + 1.0lf;
    p = p * r + 1.0lf;
    return ldexp(p, i32(k));
}

// e^x for x ≤ 0 (softmax's shifted scores).
fn exp_shifted(x: f32) -> f32 {
    if (x < -104.0f) {
        return 0.0f;
    }
    return f32(exp64(f64(x)));
}

// tanh x: an odd Taylor series near 0 (no cancellation), else 1 − 2 / (e^2x + 1).
fn tanh_cap(x32: f32) -> f32 {
    let x = f64(x32);
    let a = abs(x);
    if (a >= 20.0lf) {
        return sign(x32);
    }
    if (a < 0.0625lf) {
        let x2 = x * x;
        var p = -1382.0lf / 155925.0lf;
        p = p * x2 + 62.0lf / 2835.0lf;
        p = p * x2 - 17.0lf / 315.0lf;
        p = p * x2 + 2.0lf / 15.0lf;
        p = p * x2 - 1.0lf / 3.0lf;
        return f32(x + x * x2 * p);
    }
    return f32(1.0lf - 2.0lf / (exp64(2.0lf * x) + 1.0lf));
}
