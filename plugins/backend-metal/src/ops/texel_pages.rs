//! Weight texels (crate::texels) in shared textures, "pages": the weights of one format
//! and row length are laid one after another, in the order they are first used, in pages
//! of growing height. A layer's q, k and v (or gate and up) are then consecutive rows of
//! one page, which one dispatch reads as one weight (`super::fusion`'s matmul groups).

use std::collections::HashMap;

use crate::texels;

/// Texture rows of a format's first page: later ones double, up to the device's limit.
const FIRST_PAGE_ROWS: u32 = 2048;

/// Where a weight's rows `row0 .. row0 + rows` lie: a page and the first of its rows
/// there (`tex0`, in weight rows: a multiple of [`texels::INTERLEAVE`]).
#[derive(Clone)]
pub(crate) struct TexelPart {
    pub view: wgpu::TextureView,
    pub row0: u32,
    pub rows: u32,
    pub tex0: u32,
}

struct Page {
    texture: wgpu::Texture,
    view: wgpu::TextureView,
    /// Texture rows, and those taken.
    height: u32,
    used: u32,
}

/// The pages, by weight type and width in texels.
#[derive(Default)]
pub(crate) struct TexelPages {
    pages: HashMap<(u32, u32), Vec<Page>>,
}

impl TexelPages {
    /// Uploads `data` (texels::Layout::repack's, `width` texels a texture row) after the
    /// last weight of its kind, in a new page where the last has no room; `height` texture
    /// rows, at most `max`. Returns the page and the first texture row.
    pub fn place(
        &mut self,
        gpu: &crate::device::Gpu,
        ty: u32,
        width: u32,
        height: u32,
        max: u32,
        data: &[u8],
    ) -> (wgpu::TextureView, u32) {
        let pages = self.pages.entry((ty, width)).or_default();
        let fits = pages.last().is_some_and(|p| p.height - p.used >= height);
        if !fits {
            let grown = pages.last().map_or(FIRST_PAGE_ROWS, |p| p.height * 2);
            let page_height = grown.max(height).min(max);
            let texture = gpu.device.create_texture(&wgpu::TextureDescriptor {
                label: Some("weight texels"),
                size: wgpu::Extent3d {
                    width,
                    height: page_height,
                    depth_or_array_layers: 1,
                },
                mip_level_count: 1,
                sample_count: 1,
                dimension: wgpu::TextureDimension::D2,
                format: wgpu::TextureFormat::Rgba32Uint,
                // Read as a read-only storage texture (weights_texels.wgsl says why).
                usage: wgpu::TextureUsages::STORAGE_BINDING | wgpu::TextureUsages::COPY_DST,
                view_formats: &[],
            });
            let view = texture.create_view(&Default::default());
            pages.push(Page {
                texture,
                view,
                height: page_height,
                used: 0,
            });
        }
        let page = pages
            .last_mut()
            .expect("a page was just made if none had room");
        let y0 = page.used;
        gpu.queue.write_texture(
            wgpu::TexelCopyTextureInfo {
                texture: &page.texture,
                mip_level: 0,
                origin: wgpu::Origin3d { x: 0, y: y0, z: 0 },
                aspect: wgpu::TextureAspect::All,
            },
            data,
            wgpu::TexelCopyBufferLayout {
                offset: 0,
                bytes_per_row: Some(width * texels::TEXEL as u32),
                rows_per_image: Some(height),
            },
            wgpu::Extent3d {
                width,
                height,
                depth_or_array_layers: 1,
            },
        );
        page.used += height;
        (page.view.clone(), y0 * texels::INTERLEAVE as u32)
    }
}
