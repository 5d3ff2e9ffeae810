"""Opening the image files a run is given - prompt data's target images, a dataset's image column, the images and
targets of a reward server's request - with the raster decoders listed here only.

Left to itself PIL picks a decoder by a file's first bytes among every plugin it has: EPS among them, which hands the
file's PostScript to Ghostscript (``gs``) wherever that is installed, so a dataset row or a request could run code on
a training node or a reward server. An image too large to be one (PIL's decompression-bomb limit) is refused as an
unreadable file, not raised as PIL's own exception past the callers' checks.
"""

from __future__ import annotations

# The raster formats images and targets come in (PIL's JPEG reader also opens a phone camera's MPO).
READ_FORMATS = ("PNG", "JPEG", "WEBP", "BMP", "GIF", "TIFF")


def open_image(source):
    """``PIL.Image.open(source)`` (a path or a binary file object) for :data:`READ_FORMATS` only. Another format, or
    no image, raises ``PIL.UnidentifiedImageError`` naming the formats read; a decompression bomb an ``OSError``."""
    from PIL import Image, UnidentifiedImageError

    try:
        return Image.open(source, formats=READ_FORMATS)
    except UnidentifiedImageError as err:
        raise UnidentifiedImageError(f"{err}: not an image of a format read here ({', '.join(READ_FORMATS)})") from None
    except Image.DecompressionBombError as err:
        raise OSError(str(err)) from None
