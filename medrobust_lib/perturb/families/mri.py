"""MRI acquisition artifacts, modelled in k-space where the physics lives there.

Conventions: the phase-encode axis is the row axis (axis 0), the read-out axis the column axis.
k-space is the 2-D DFT of the image (``scipy.fft.fft2`` over axes 0 and 1, so RGB images are
treated channel by channel); reconstructed images are magnitude images ``|ifft2(.)|``, as a
scanner displays them. All random draws are made up front with a fixed count, independent of the
strength (common random numbers); strength only scales or selects.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import scipy.fft as sfft

from medrobust_lib.perturb.field_ops import per_pixel
from medrobust_lib.perturb.spec import perturbation
from medrobust_lib.types import FloatImage

FAMILY = "mri"
MODALITIES = ("mri",)

MOTION_RMS_SHIFT = 0.12
"""RMS displacement of the motion trajectory, as a fraction of the field of view."""
MOTION_HARMONICS = 4
SPIKES_MAX = 3
GHOST_PERIODS = (2, 2, 3, 4)
"""Line-modulation periods to draw from; period 2 (the EPI N/2 ghost) is drawn half the time."""
BIAS_DEGREE = 3
GIBBS_EDGE_BINS = 3.0


def _kspace(image: FloatImage) -> npt.NDArray[np.complex64]:
    return sfft.fft2(np.asarray(image, np.float32), axes=(0, 1))  # type: ignore[no-any-return]


def _magnitude(kspace: np.ndarray) -> FloatImage:
    return np.abs(sfft.ifft2(kspace, axes=(0, 1))).astype(np.float32)


def _freqs(n: int) -> npt.NDArray[np.float32]:
    """Signed integer frequency index of each DFT bin, in cycles per field of view."""
    return (np.fft.fftfreq(n) * n).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# rigid motion
# ---------------------------------------------------------------------------------------------


def motion_trajectory(rng: np.random.Generator, h: int) -> npt.NDArray[np.float64]:
    """The drawn unit motion trajectory: (dy, dx) per phase-encode line in FFT line order, zero
    at the acquisition of the k-space centre line (the reference position, which sets where the
    anatomy appears), root-mean-square displacement 1."""
    amps = rng.normal(size=(2, MOTION_HARMONICS))
    phases = rng.uniform(0.0, 2.0 * np.pi, size=(2, MOTION_HARMONICS))
    freqs = rng.uniform(1.0, 8.0, size=(2, MOTION_HARMONICS))
    t = np.linspace(0.0, 1.0, h, endpoint=False)[:, None, None]
    traj = (amps * np.sin(2.0 * np.pi * freqs * t + phases)).sum(axis=-1)  # (h, 2)
    # Lines are acquired in sequential ky order (most negative first): line ky is acquired at
    # time rank(ky), so map the trajectory from acquisition time onto the FFT line order.
    acq_index = np.argsort(np.argsort(_freqs(h), kind="stable"), kind="stable")
    traj = traj[acq_index]
    traj -= traj[0]  # FFT line 0 is ky = 0
    traj /= max(float(np.sqrt((traj**2).sum(axis=1).mean())), 1e-12)
    return traj  # type: ignore[no-any-return]


@perturbation(
    "kspace_motion", family=FAMILY, modalities=MODALITIES, strength_range=(0.0, 1.0),
    levels=(0.22, 0.4, 0.56, 0.72, 0.9), unit="fraction of the signal acquired during motion",
    reference="Rigid translation during acquisition: k-space lines get the linear phase ramp "
              "exp(-2 pi i k.d(t)) of the displacement at their acquisition time (Fourier shift "
              "theorem); Zaitsev et al., JMRI 2015",
)
def kspace_motion(image: FloatImage, strength: float, rng: np.random.Generator) -> FloatImage:
    """Rigid in-plane motion during a Cartesian, signal-averaged acquisition.

    A smooth motion trajectory d(t) (a sum of 4 drawn sinusoids of 1 to 8 cycles per
    acquisition in each direction, like breathing or swallowing; RMS displacement
    ``MOTION_RMS_SHIFT`` of the field of view) is drawn. The phase-encode lines are acquired in
    sequential order, so in a moving acquisition each line carries the phase ramp of the
    displacement at its acquisition time. ``strength`` in [0, 1] is the fraction of the
    averaged signal acquired while the patient moved: k-space is ``(1 - s) F + s F_moved``, which
    keeps SSIM monotone in the strength (a growing displacement would wrap phases). The
    magnitude image shows ghosts and blurring along the phase-encode axis while the anatomy
    stays in place (the trajectory is zero when the k-space centre is acquired, which fixes the
    displayed position, so there is no global shift).
    """
    h, w = image.shape[:2]
    traj = motion_trajectory(rng, h) * MOTION_RMS_SHIFT
    if strength <= 0.0:
        return image.copy()
    # Phase in cycles, wrapped in float64 before the float32 trig (exact enough, 3x faster).
    cycles = _freqs(h)[:, None] * traj[:, 0:1] + _freqs(w)[None, :] * traj[:, 1:2]
    angle = (2.0 * np.pi * (cycles - np.round(cycles))).astype(np.float32)
    mod = np.empty(angle.shape, np.complex64)
    mod.real = np.float32(1.0 - strength) + np.float32(strength) * np.cos(angle)
    mod.imag = np.float32(-strength) * np.sin(angle)
    return _magnitude(_kspace(image) * per_pixel(mod, image))


# ---------------------------------------------------------------------------------------------
# bias field
# ---------------------------------------------------------------------------------------------


def bias_log_field(rng: np.random.Generator, h: int, w: int) -> npt.NDArray[np.float32]:
    """A drawn low-order (Legendre, total degree <= 3, no constant term) smooth field,
    normalised to unit root-mean-square over the image."""
    terms = [(i, j) for i in range(BIAS_DEGREE + 1) for j in range(BIAS_DEGREE + 1 - i) if i + j > 0]
    coef = rng.normal(size=len(terms))
    y = np.polynomial.legendre.legvander(np.linspace(-1.0, 1.0, h), BIAS_DEGREE)
    x = np.polynomial.legendre.legvander(np.linspace(-1.0, 1.0, w), BIAS_DEGREE)
    field = np.zeros((h, w))
    for c, (i, j) in zip(coef, terms, strict=True):
        field += c * np.outer(y[:, i], x[:, j])
    field /= max(float(np.sqrt(np.mean(field**2))), 1e-12)
    return field.astype(np.float32)


@perturbation(
    "bias_field", family=FAMILY, modalities=MODALITIES, strength_range=(0.0, 2.0),
    levels=(0.28, 0.5, 0.75, 1.05, 1.45), unit="RMS log gain (nepers)",
    reference="RF (B1) inhomogeneity as a smooth multiplicative field exp(sum c_ij P_i(x) P_j(y)); "
              "Sled et al., IEEE TMI 1998 (N3); TorchIO RandomBiasField",
)
def bias_field(image: FloatImage, strength: float, rng: np.random.Generator) -> FloatImage:
    """Smooth multiplicative intensity inhomogeneity ``x * exp(strength * P)``.

    ``P`` is a drawn Legendre polynomial of total degree <= 3 in (x, y), without a constant term,
    normalised to unit root-mean-square; ``strength`` in [0, 2] is the RMS log gain in nepers
    (0.7 is a typical gain spread of 0.5 to 2; the extremes of ``P`` reach 2 to 3 times the RMS,
    so at 2 parts of the image saturate and others go nearly black, as far from a surface coil).
    Flat, textureless images (a phantom) keep SSIM near 0.7 even at the strongest setting: only
    luminance changes there."""
    h, w = image.shape[:2]
    field = np.exp(strength * bias_log_field(rng, h, w))
    return (image * per_pixel(field, image)).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# ghosting
# ---------------------------------------------------------------------------------------------


def ghost_period(rng: np.random.Generator) -> int:
    """Draw the line-modulation period of ``ghosting``, in phase-encode lines."""
    return int(GHOST_PERIODS[int(rng.integers(len(GHOST_PERIODS)))])


@perturbation(
    "ghosting", family=FAMILY, modalities=MODALITIES, strength_range=(0.0, 1.0),
    levels=(0.2, 0.38, 0.55, 0.72, 0.9), unit="signal fraction moved into the ghosts",
    reference="Periodic k-space line modulation m(k) = 1 - a + a cos(2 pi k / p) gives replicas shifted "
              "by N/p along phase encoding (N/2 EPI Nyquist ghost for p = 2, odd/even echo "
              "inconsistency); Bernstein et al., Handbook of MRI Pulse Sequences 2004",
)
def ghosting(image: FloatImage, strength: float, rng: np.random.Generator) -> FloatImage:
    """Ghost replicas along the phase-encode axis (rows).

    The phase-encode lines are modulated with period ``p`` lines (drawn from 2, 3, 4; 2 half of
    the time, the EPI Nyquist ghost of an odd/even line inconsistency), with the k-space centre
    line unmodulated, so the reconstruction is ``(1 - a) x + a/2 (x(y - N/p) + x(y + N/p))``
    (replica shifts wrap around the field of view, as aliasing does); for ``p = 2`` both
    replicas coincide: ``(1 - a) x + a x(y - N/2)``. ``strength`` a in [0, 1] is the fraction of
    the signal moved into the ghosts (at 1, odd lines inverted for ``p = 2``, only ghosts remain).
    """
    h = image.shape[0]
    period = ghost_period(rng)
    if strength <= 0.0:
        return image.copy()
    # Signed line index, so the modulation is even in ky and the ghost a (possibly fractional,
    # band-limited) shift of a real image when p does not divide N.
    ky = _freqs(h).astype(np.float64)
    mod = (1.0 - strength + strength * np.cos(2.0 * np.pi * ky / period)).astype(np.complex64)
    return _magnitude(_kspace(image) * per_pixel(mod[:, None], image))


# ---------------------------------------------------------------------------------------------
# Rician noise
# ---------------------------------------------------------------------------------------------


@perturbation(
    "rician_noise", family=FAMILY, modalities=MODALITIES, strength_range=(0.0, 0.25),
    levels=(0.01, 0.017, 0.024, 0.033, 0.045), unit="sigma (intensity units)", strength_is_intensity=True,
    reference="Rician magnitude noise |x + sigma n1 + i sigma n2| with n1, n2 ~ N(0, 1); "
              "Gudbjartsson & Patz, MRM 1995",
)
def rician_noise(image: FloatImage, strength: float, rng: np.random.Generator) -> FloatImage:
    """Magnitude of the image plus complex white Gaussian noise; ``strength`` is sigma in
    intensity units, [0, 0.25]. The background acquires the Rayleigh floor sigma * sqrt(pi / 2)."""
    n1 = rng.standard_normal(image.shape, dtype=np.float32)
    n2 = rng.standard_normal(image.shape, dtype=np.float32)
    s = np.float32(strength)
    return np.sqrt((image + s * n1) ** 2 + (s * n2) ** 2).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# Gibbs ringing
# ---------------------------------------------------------------------------------------------


def _truncation_weights(n: int, removed: float) -> npt.NDArray[np.float32]:
    """1 inside the kept radius (1 - removed) * n / 2, 0 outside, with a linear edge over
    ``GIBBS_EDGE_BINS`` bins so the truncation moves continuously with ``removed`` (a one-bin edge
    makes SSIM wiggle as single lines drop out); all ones at ``removed = 0``."""
    radius = (1.0 - removed) * n / 2.0
    edge = GIBBS_EDGE_BINS
    return np.clip((radius + edge - np.abs(_freqs(n))) / edge, 0.0, 1.0).astype(np.float32)


@perturbation(
    "gibbs_ringing", family=FAMILY, modalities=MODALITIES, strength_range=(0.0, 0.95),
    levels=(0.3, 0.55, 0.72, 0.82, 0.9), unit="fraction of k-space extent removed",
    reference="k-space truncation (sinc point-spread function, ~9% overshoot at edges); "
              "Gibbs phenomenon, Wood & Henkelman / Bernstein et al. 2004",
)
def gibbs_ringing(image: FloatImage, strength: float, rng: np.random.Generator) -> FloatImage:
    """Truncated acquisition: only the centred ``1 - strength`` of k-space is kept along both
    axes (a hard box, its edge linear over 3 bins for continuity), giving ringing next to edges
    and loss of resolution. ``strength`` in [0, 0.95] is the fraction of the k-space extent
    removed. Deterministic (the generator is not used)."""
    if strength <= 0.0:
        return image.copy()
    h, w = image.shape[:2]
    win = np.outer(_truncation_weights(h, strength), _truncation_weights(w, strength))
    return _magnitude(_kspace(image) * per_pixel(win, image))


# ---------------------------------------------------------------------------------------------
# k-space spike (herringbone)
# ---------------------------------------------------------------------------------------------


def spike_draw(rng: np.random.Generator, h: int, w: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Positions (row, col FFT indices), complex unit phases and relative amplitudes of the
    ``SPIKES_MAX`` drawn spikes; only the first 1 to 3 (drawn) have non-zero amplitude."""
    n_on = int(rng.integers(1, SPIKES_MAX + 1))
    radius = rng.uniform(0.04, 0.45, size=SPIKES_MAX)
    angle = rng.uniform(0.0, 2.0 * np.pi, size=SPIKES_MAX)
    phase = rng.uniform(0.0, 2.0 * np.pi, size=SPIKES_MAX)
    rel = rng.uniform(0.5, 1.0, size=SPIKES_MAX)
    rel[0] = 1.0
    rel[n_on:] = 0.0
    ky = np.rint(radius * np.sin(angle) * h).astype(np.int64) % h
    kx = np.rint(radius * np.cos(angle) * w).astype(np.int64) % w
    return np.stack([ky, kx], axis=1), np.exp(1j * phase), rel


@perturbation(
    "kspace_spike", family=FAMILY, modalities=MODALITIES, strength_range=(0.0, 0.5),
    levels=(0.035, 0.06, 0.09, 0.12, 0.16), unit="spike amplitude / max |k-space|",
    reference="Herringbone artifact: a spurious k-space sample (RF spike) becomes a plane-wave "
              "stripe pattern over the magnitude image; Zhuo & Gullapalli, RadioGraphics 2006",
)
def kspace_spike(image: FloatImage, strength: float, rng: np.random.Generator) -> FloatImage:
    """Spike noise: 1 to 3 drawn k-space samples (away from the centre) get a complex spike of
    amplitude ``strength * max |k-space|`` (times a drawn factor in [0.5, 1] for the extra
    spikes), producing the herringbone stripe pattern. ``strength`` in [0, 0.5]; for a
    non-negative image max |k-space| is the DC term, so the stripes have amplitude
    ``strength * mean(image)`` in the image domain."""
    h, w = image.shape[:2]
    pos, phase, rel = spike_draw(rng, h, w)
    k = _kspace(image)
    peak = np.abs(k).reshape(-1, *k.shape[2:]).max(axis=0)  # per channel
    for (ky, kx), ph, r in zip(pos, phase, rel, strict=True):
        k[ky, kx] += (strength * r * ph * peak).astype(np.complex64)
    return _magnitude(k)
